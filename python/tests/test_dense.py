"""Dense gradwire through Python equals PyTorch DDP (gloo) on the same model, seed and data."""

import pytest
import torch

from launch import Job


def close(a, b, rel=1e-6):
    return float((a - b).norm() / b.norm()) <= rel


@pytest.mark.parametrize("world", [2, 4])
def test_dense_optimizer_and_allreduce_match_ddp(tmp_path, world):
    Job("ddp", world, tmp_path).run()
    Job("gw_optimizer", world, tmp_path).run()
    Job("gw_allreduce", world, tmp_path).run()
    ddp = torch.load(tmp_path / "ddp-default-none.pt")
    opt = torch.load(tmp_path / "gw-optimizer-none.pt")
    red = torch.load(tmp_path / "gw-allreduce.pt")
    # The model trained: its parameters moved.
    assert ddp["losses"][-1] < ddp["losses"][0]
    diff = float((opt["params"] - ddp["params"]).norm() / ddp["params"].norm())
    assert close(opt["params"], ddp["params"]), f"DistributedOptimizer: relative {diff:.3g}"
    assert close(red["params"], ddp["params"]), "allreduce_"


def test_comm_hook_none_matches_ddp_default(tmp_path):
    Job("ddp", 2, tmp_path).run()
    Job("ddp", 2, tmp_path, args=["gradwire", "none"]).run()
    ddp = torch.load(tmp_path / "ddp-default-none.pt")
    hook = torch.load(tmp_path / "ddp-gradwire-none.pt")
    assert close(hook["params"], ddp["params"])
    assert hook["bytes"]["raw_bytes"] > 0, "the gradients did not go through gradwire"


def test_comm_hook_powersgd_trains_and_compresses(tmp_path):
    Job("ddp", 2, tmp_path, args=["gradwire", "none", 40]).run()
    Job("ddp", 2, tmp_path, args=["gradwire", "powersgd:rank=2", 40]).run()
    dense = torch.load(tmp_path / "ddp-gradwire-none.pt")
    psgd = torch.load(tmp_path / "ddp-gradwire-powersgd_rank=2.pt")
    first, last = sum(psgd["losses"][:5]) / 5, sum(psgd["losses"][-5:]) / 5
    assert last < 0.9 * first, f"PowerSGD did not train: {first:.3f} -> {last:.3f}"
    assert psgd["bytes"]["wire_bytes"] < 0.5 * dense["bytes"]["wire_bytes"], (psgd["bytes"],
                                                                            dense["bytes"])


def test_horovod_api(tmp_path):
    Job("api", 3, tmp_path).run()
    for r in range(3):
        assert (tmp_path / f"api-rank{r}.ok").exists()
