"""`gw.elastic.run` under `gradwire launch --elastic`: a rank killed mid-step leaves the
others training as a smaller world from their last commit, a process started with
`gradwire launch --join` is admitted at a later commit, and every rank of the last world ends
with the same parameters. Without an elastic launcher `run` calls the function once."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launch import HERE, Job, gradwire_bin

DEADLINE_S = 60


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GRADWIRE_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                          "MASTER_ADDR", "MASTER_PORT")}
    env.update({"GRADWIRE_TIMEOUT": "10", "OMP_NUM_THREADS": "1"})
    return env


def _logs(out):
    """`{pid: [(generation, size, rank), ...]}` from the ranks' logs."""
    got = {}
    for path in glob.glob(os.path.join(out, "log-*.txt")):
        pid = int(os.path.basename(path)[4:-4])
        with open(path) as f:
            got[pid] = [tuple(int(v) for v in line.split()) for line in f if line.strip()]
    return got


def _stop(proc):
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def test_elastic_run_loses_a_rank_and_admits_a_joiner(tmp_path):
    exe = gradwire_bin()
    # scripts/python-tests.sh builds it when it is missing; never skipped silently.
    assert exe is not None, "gradwire is not built: cargo build -p gradwire (or set GRADWIRE_BIN)"
    out, join_file = str(tmp_path), str(tmp_path / "join.json")
    launch_log = open(tmp_path / "launch.log", "w+")
    joiner_log = open(tmp_path / "joiner.log", "w+")
    launcher = joiner = None
    deadline = time.monotonic() + DEADLINE_S
    try:
        launcher = subprocess.Popen(
            [exe, "launch", "--elastic", "2:4", "-n", "3", "--join-file", join_file, "--",
             sys.executable, os.path.join(HERE, "jobs.py"), "elastic_mlp", out],
            env=_env(), stdout=launch_log, stderr=subprocess.STDOUT, start_new_session=True)

        def output():
            launch_log.seek(0)
            joiner_log.seek(0)
            return f"--- launcher:\n{launch_log.read()}\n--- joiner:\n{joiner_log.read()}"

        # The joiner starts once the survivors train as generation 1.
        while not any(g == 1 for lines in _logs(out).values() for g, _, _ in lines):
            assert launcher.poll() is None, f"the job ended early:\n{output()}"
            assert time.monotonic() < deadline, f"no generation 1 in time:\n{output()}"
            time.sleep(0.1)
        joiner = subprocess.Popen([exe, "launch", "--join", join_file], env=_env(),
                                  stdout=joiner_log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            rc = launcher.wait(timeout=max(1.0, deadline - time.monotonic()))
            joiner_rc = joiner.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end within {DEADLINE_S} s:\n{output()}")
        assert rc == 0, f"gradwire launch exited {rc}:\n{output()}"
        assert joiner_rc == 0, f"the joiner exited {joiner_rc}:\n{output()}"

        logs = _logs(out)
        sizes = {g: s for lines in logs.values() for g, s, _ in lines}
        assert sizes == {0: 3, 1: 2, 2: 3}, f"world sizes by generation: {sizes}\n{output()}"
        assert len(logs) == 4, f"expected 3 processes and a joiner: {logs}"
        finals = {}
        for path in glob.glob(os.path.join(out, "final-*.json")):
            with open(path) as f:
                finals[int(os.path.basename(path)[6:-5])] = json.load(f)
        # The victim wrote nothing; the two survivors and the joiner did.
        assert len(finals) == 3, f"final states: {finals}\n{output()}"
        assert {f["size"] for f in finals.values()} == {3}, finals
        assert sorted(f["rank"] for f in finals.values()) == [0, 1, 2], finals
        assert len({f["hash"] for f in finals.values()}) == 1, f"parameters differ: {finals}"
        joiners = [pid for pid, lines in logs.items() if lines[0][0] == 2]
        assert len(joiners) == 1 and joiners[0] in finals, logs
    finally:
        _stop(joiner)
        _stop(launcher)
        # A rank the launcher left behind (it kills its ranks when it ends).
        for pid in _logs(out):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_run_without_an_elastic_launcher_calls_once_and_restores(tmp_path):
    Job("elastic_local", 1, tmp_path, timeout=60).run()
    assert (tmp_path / "elastic-local.ok").exists()
