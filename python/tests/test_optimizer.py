"""DistributedOptimizer with gradwire's codecs: it trains, and the codec's bytes are what go on
the wire."""

import torch

from launch import Job


def test_dgc_through_the_optimizer_trains_with_a_fraction_of_the_bytes(tmp_path):
    dgc = "dgc:ratio=0.05,warmup_epochs=0"
    Job("gw_optimizer", 2, tmp_path, args=["none", 60]).run()
    Job("gw_optimizer", 2, tmp_path, args=[dgc, 60]).run()
    dense = torch.load(tmp_path / "gw-optimizer-none.pt")
    sparse = torch.load(tmp_path / f"gw-optimizer-{dgc.replace(':', '_')}.pt")
    first, last = sum(sparse["losses"][:5]) / 5, sum(sparse["losses"][-5:]) / 5
    dense_last = sum(dense["losses"][-5:]) / 5
    assert last < 0.9 * first, f"DGC did not train: {first:.3f} -> {last:.3f}"
    print(f"loss: DGC {first:.3f} -> {last:.3f}, dense -> {dense_last:.3f}")
    assert sparse["bytes"]["raw_bytes"] == dense["bytes"]["raw_bytes"]
    assert sparse["bytes"]["wire_bytes"] < 0.3 * dense["bytes"]["wire_bytes"], (
        sparse["bytes"], dense["bytes"])
