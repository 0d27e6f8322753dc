"""Every codec spec gives, through Python, the payload bytes and the decoded values of the
Rust reference (`crates/codec/examples/codec_reference.rs`) on the same gradient."""

import os
import struct
import subprocess

import pytest
import torch

import gradwire
from gradwire import codec

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHAPE = (48, 40)
STEPS, SEED, RANK, WORLD, EPOCHS_PER_STEP = 3, 11, 1, 4, 0.5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("codec-reference")
    grad = torch.randn(SHAPE, generator=torch.Generator().manual_seed(5))
    values = grad.flatten().tolist()
    (d / "grad.f32").write_bytes(struct.pack(f"<{len(values)}f", *values))
    specs = codec.examples()
    (d / "specs.txt").write_text("\n".join(specs) + "\n")
    subprocess.run(
        ["cargo", "run", "-q", "-p", "gradwire-codec", "--example", "codec_reference", "--",
         str(d / "grad.f32"), "x".join(map(str, SHAPE)), str(d / "specs.txt"), str(d / "out"),
         str(STEPS), str(SEED), str(RANK), str(WORLD), str(EPOCHS_PER_STEP)],
        cwd=ROOT, check=True)
    return grad, specs, d / "out"


def test_every_codec_matches_the_rust_reference(reference):
    grad, specs, out = reference
    assert len(specs) >= 20, specs
    for i, spec in enumerate(specs):
        payloads = codec.encode(spec, grad, SHAPE, steps=STEPS, seed=SEED, rank=RANK,
                                world=WORLD, epochs_per_step=EPOCHS_PER_STEP)
        assert len(payloads) == STEPS
        for s, p in enumerate(payloads):
            want = (out / f"{i}.step{s}.bin").read_bytes()
            assert p == want, f"{spec}: step {s} payload differs ({len(p)} vs {len(want)} bytes)"
        decoded = codec.decode(spec, payloads[-1], SHAPE)
        raw = (out / f"{i}.decoded.f32").read_bytes()
        want = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        assert decoded == want, f"{spec}: decoded values differ"


def test_specs_are_checked_and_payloads_validated():
    with pytest.raises(ValueError, match="nosuchcodec"):
        codec.normalize("nosuchcodec")
    assert codec.normalize("topk").startswith("topk:")
    with pytest.raises(gradwire.GradwireError):
        codec.decode("qsgd", b"\x00\x01garbage", [10])
    with pytest.raises(ValueError):
        codec.encode("none", b"\x00" * 12, [4])
