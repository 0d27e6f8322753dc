"""Starts a job's ranks as processes of `jobs.py` and cleans them up, also on failure."""

import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gradwire_bin():
    """The `gradwire` binary: `GRADWIRE_BIN`, else the workspace's release build, else its
    debug build (what `cargo test --workspace` leaves); `None` when none is built."""
    env = os.environ.get("GRADWIRE_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    for profile in ("release", "debug"):
        path = os.path.join(HERE, "..", "..", "target", profile, "gradwire")
        if os.access(path, os.X_OK):
            return path
    return None


class Job:
    """`world` processes running `jobs.py JOB OUT [ARGS]`, with gradwire's launcher
    variables (and torch's, for the gloo baselines). `run()` waits up to `timeout` seconds
    and kills every process that is left, whatever happens."""

    def __init__(self, job, world, out, args=(), env=None, timeout=120):
        self.job, self.world, self.out, self.args = job, world, out, list(args)
        self.env, self.timeout = dict(env or {}), timeout
        self.procs = []

    def start(self):
        gw_port, torch_port = free_port(), free_port()
        for r in range(self.world):
            env = dict(os.environ)
            env.update({
                "GRADWIRE_RANK": str(r), "GRADWIRE_WORLD_SIZE": str(self.world),
                "GRADWIRE_LOCAL_RANK": str(r), "GRADWIRE_LOCAL_SIZE": str(self.world),
                "GRADWIRE_MASTER_ADDR": "127.0.0.1", "GRADWIRE_MASTER_PORT": str(gw_port),
                "GRADWIRE_TOKEN": "pytest", "GRADWIRE_TIMEOUT": env.get("GRADWIRE_TIMEOUT", "20"),
                "RANK": str(r), "WORLD_SIZE": str(self.world), "LOCAL_RANK": str(r),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(torch_port),
                "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
            })
            env.update(self.env)
            self.procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "jobs.py"), self.job, str(self.out)]
                + [str(a) for a in self.args],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True))
        return self

    def wait(self):
        """`(returncode, output)` of every rank; kills everything left at the deadline."""
        deadline = time.monotonic() + self.timeout
        results = []
        try:
            for p in self.procs:
                left = max(0.1, deadline - time.monotonic())
                try:
                    out, _ = p.communicate(timeout=left)
                except subprocess.TimeoutExpired:
                    self.kill()
                    out, _ = p.communicate()
                    out += f"\n[killed at the {self.timeout} s deadline]"
                results.append((p.returncode, out))
        finally:
            self.kill()
        return results

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def run(self):
        """Starts, waits, and fails (with every rank's output) unless every rank exited 0."""
        self.start()
        results = self.wait()
        bad = [(r, rc, out) for r, (rc, out) in enumerate(results) if rc != 0]
        if bad:
            text = "\n".join(f"--- rank {r} exited {rc}:\n{out}" for r, rc, out in bad)
            raise AssertionError(f"job {self.job} on {self.world} ranks failed:\n{text}")
        return results
