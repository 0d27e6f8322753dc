"""CUDA tensors. On a machine with a GPU: a model trained on it through DistributedOptimizer
(gradients reduced from device memory, never copied in Python) equals the same training on
the CPU, and CUDA all-reduce and broadcast give the sums computed here. On a machine without
one: a tensor on another device and a device pointer without a CUDA driver are refused with
errors that say so (both branches assert; neither skips)."""

import torch

from launch import Job


def test_cuda_tensors_train_like_cpu_ones_or_are_refused_clearly(tmp_path):
    Job("cuda", 2, tmp_path).run()
    got = [torch.load(tmp_path / f"cuda-rank{r}.pt") for r in range(2)]
    if not torch.cuda.is_available():
        for r, g in enumerate(got):
            assert not g["cuda"]
            assert "CPU and CUDA tensors" in g["checks"].get("meta", ""), (r, g)
            assert "no CUDA driver" in g["checks"].get("nodriver", ""), (r, g)
        return
    Job("gw_optimizer", 2, tmp_path).run()
    cpu = torch.load(tmp_path / "gw-optimizer-none.pt")
    for r, g in enumerate(got):
        assert g["cuda"] and g["sum_ok"] and g["bcast_ok"], (r, g)
        # Both ranks hold the same model, and it is the CPU run's up to the GPU's rounding.
        assert torch.equal(g["params"], got[0]["params"]), f"rank {r} differs from rank 0"
        diff = float((g["params"] - cpu["params"]).norm() / cpu["params"].norm())
        assert diff < 1e-4, f"rank {r}: relative difference {diff:.3g} from the CPU run"
