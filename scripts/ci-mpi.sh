#!/usr/bin/env bash
# CI for the MPI transport (gradwire-transport feature `mpi`): installs Open MPI and libclang
# (rsmpi's build needs both), then runs the collective suite under `mpirun -np 1, 2, 3 and 4`
# and the README's `mpirun` and `srun` lines with the CLI built with MPI.
# `.ci/run` calls this after its own checks; it can also run on its own from the repo root.
# GRADWIRE_REQUIRE_MPI=1 makes a missing `mpirun` a failure instead of a loud skip.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
export CARGO_TERM_COLOR=never
if ! dpkg -s openmpi-bin libopenmpi-dev libclang-dev >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev libclang-dev >/dev/null
fi

# Open MPI in a container, as root, with more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

cargo clippy -p gradwire-transport -p gradwire-collective --all-targets --features gradwire-collective/mpi,gradwire-collective/test-util -- -D warnings
cargo test -p gradwire-transport --features mpi --lib
GRADWIRE_REQUIRE_MPI=1 GRADWIRE_MPI_TEST_TIMEOUT=600 \
    cargo test -p gradwire-collective --features mpi,test-util --test mpi

# The CLI built with MPI (workspace-wide, so burn's features and build are those of the main
# CI run): clippy, then the README's `mpirun -np 3` and `srun -n 3` lines of `gradwire check`
# and `gradwire train`, run as written (crates/cli/tests/mpirun.rs; srun through a stand-in).
cargo clippy --workspace --all-targets --features gradwire/mpi -- -D warnings
GRADWIRE_REQUIRE_MPI=1 GRADWIRE_MPI_TEST_TIMEOUT=600 \
    cargo test --workspace --features gradwire/mpi --test mpirun
