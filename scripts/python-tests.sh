#!/usr/bin/env bash
# The Python package's tests, as CI runs them: a virtual environment with torch and pytest
# (from PyPI, installed once and kept), the package built from this checkout
# (`pip install ./python`, a release build of the Rust extension), then pytest.
#
# Env: GRADWIRE_PY_VENV (default ~/.cache/gradwire/venv-python), TORCH_VERSION (2.15.0),
# PYTHON (the base interpreter, default python3). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${GRADWIRE_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/gradwire/venv-python}"
TORCH_VERSION="${TORCH_VERSION:-2.15.0}"
log() { echo "[python-tests] $*" >&2; }

if ! "$VENV/bin/python" -c "import torch, pytest, maturin" 2>/dev/null; then
  log "creating $VENV with torch $TORCH_VERSION (PyPI's wheel brings its CUDA libraries, ~4 GB)"
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q --no-cache-dir "torch==$TORCH_VERSION" pytest "maturin>=1.9,<2"
  # triton (~1 GB) serves only torch.compile.
  "$VENV/bin/python" -m pip uninstall -y -q triton >/dev/null 2>&1 || true
fi
# The elastic test starts jobs with `gradwire launch --elastic`: a built binary (the release
# one, else the debug one `cargo test --workspace` leaves, else built here).
if [ -z "${GRADWIRE_BIN:-}" ] && [ ! -x target/release/gradwire ] && [ ! -x target/debug/gradwire ]; then
  log "cargo build -p gradwire (for gradwire launch)"
  cargo build -q -p gradwire
fi
log "pip install ./python"
"$VENV/bin/python" -m pip install -q ./python
# From the repository root, so that `import gradwire` finds the installed package, not the
# source folder python/gradwire.
log "pytest python/tests"
exec "$VENV/bin/python" -m pytest -q python/tests "$@"
