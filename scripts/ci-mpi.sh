#!/usr/bin/env bash
# CI for the MPI transport (gradwire-transport feature `mpi`): installs Open MPI and libclang
# (rsmpi's build needs both), then runs the collective suite under `mpirun -np 2, 3 and 4`.
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
