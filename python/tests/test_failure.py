"""A rank killed mid-step makes the others raise an error naming it, within the deadline, and
no process is left behind."""

import re

from launch import Job

DEADLINE_S = 10


def test_killed_rank_is_named_within_the_deadline(tmp_path):
    job = Job("kill", 3, tmp_path, args=[2, 3], env={"GRADWIRE_TIMEOUT": str(DEADLINE_S)},
              timeout=90).start()
    results = job.wait()
    assert results[2][0] == -9, f"the victim was not killed: {results[2]}"
    for r in (0, 1):
        rc, out = results[r]
        assert rc == 0, f"rank {r} exited {rc}:\n{out}"
        took, message = (tmp_path / f"rank{r}.txt").read_text().split("\n", 1)
        assert re.search(r"\brank 2\b", message), f"rank {r}: {message}"
        assert float(took) < DEADLINE_S + 5, f"rank {r} took {took} s: {message}"
    assert all(p.poll() is not None for p in job.procs), "a process was left behind"
