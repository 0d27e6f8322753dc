"""gw.state_dict() saved with the model and optimizer resumes a run bit-identically: DGC in
the middle of its warm-up, with its residuals and velocity, and SGD's weight-decay momentum."""

import pytest
import torch

from launch import Job


@pytest.mark.parametrize("codec", ["dgc:ratio=0.05,warmup_epochs=1", "qsgd:bits=4",
                                   "topk:ratio=0.05"])
def test_resumed_run_is_bit_identical(tmp_path, codec):
    Job("resume", 2, tmp_path, args=["full", codec]).run()
    Job("resume", 2, tmp_path, args=["first", codec]).run()
    Job("resume", 2, tmp_path, args=["second", codec]).run()
    full = torch.load(tmp_path / "resume-full.pt")["params"]
    resumed = torch.load(tmp_path / "resume-second.pt")["params"]
    assert torch.equal(full, resumed), float((full - resumed).abs().max())


def test_resuming_without_the_engine_state_differs(tmp_path):
    """The check above can fail: dropping the engine's state changes the result."""
    codec = "dgc:ratio=0.05,warmup_epochs=1"
    Job("resume", 2, tmp_path, args=["full", codec]).run()
    Job("resume", 2, tmp_path, args=["first", codec]).run()
    for r in range(2):
        ckpt = torch.load(tmp_path / f"ckpt-rank{r}.pt")
        ckpt["gradwire"] = None
        torch.save(ckpt, tmp_path / f"ckpt-rank{r}.pt")
    Job("resume", 2, tmp_path, args=["second", codec], env={"GW_SKIP_ENGINE_STATE": "1"}).run()
    full = torch.load(tmp_path / "resume-full.pt")["params"]
    resumed = torch.load(tmp_path / "resume-second.pt")["params"]
    assert not torch.equal(full, resumed)
