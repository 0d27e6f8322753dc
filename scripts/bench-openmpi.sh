#!/bin/bash
# gradwire's all-reduce (tcp, shm) against Open MPI's (btl tcp,self and self,vader), in one
# run of this script, alternating ours and theirs: P = 2 and 4, 4KiB..64MiB, two runs; then the ratio
# table (scripts/bench-openmpi-table.py). Writes every JSON file into OUT.
#
#   G=target/release/gradwire OUT=docs/results/allreduce-openmpi/RUN scripts/bench-openmpi.sh
#
# G: the gradwire binary (`bench allreduce` is called on it). RUNS, PS, SIZES override the
# defaults (2; "2 4"; 4KiB,64KiB,1MiB,16MiB,64MiB). BASE: optionally an older gradwire binary,
# run right after G each time (base-*.json), so before/after ratios come from one run.
set -u
cd "$(dirname "$0")/.."
G=${G:-target/release/gradwire}
BASE=${BASE:-}
for b in "$G" ${BASE:+"$BASE"}; do
  [ -x "$b" ] || { echo "no gradwire binary at $b (set G, or BASE)" >&2; exit 2; }
done
OUT=${OUT:-bench-openmpi-$(date +%Y%m%d-%H%M)}
S=${SIZES:-4KiB,64KiB,1MiB,16MiB,64MiB}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# No CMA in containers: vader copies through its shared segment.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
for run in $(seq 1 "${RUNS:-2}"); do for p in ${PS:-2 4}; do
  $G bench allreduce --np $p --transport tcp --sizes $S --json $OUT/gw-tcp-p$p-r$run.json > /dev/null 2>$OUT/gw-tcp-p$p-r$run.err
  [ -z "$BASE" ] || $BASE bench allreduce --np $p --transport tcp --sizes $S --json $OUT/base-tcp-p$p-r$run.json > /dev/null 2>$OUT/base-tcp-p$p-r$run.err
  mpirun --oversubscribe -np $p --mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include lo \
    /usr/bin/python3 scripts/bench-mpi.py --sizes $S --json $OUT/ompi-tcp-p$p-r$run.json > /dev/null 2>$OUT/ompi-tcp-p$p-r$run.err
  $G bench allreduce --np $p --transport shm --sizes $S --json $OUT/gw-shm-p$p-r$run.json > /dev/null 2>$OUT/gw-shm-p$p-r$run.err
  [ -z "$BASE" ] || $BASE bench allreduce --np $p --transport shm --sizes $S --json $OUT/base-shm-p$p-r$run.json > /dev/null 2>$OUT/base-shm-p$p-r$run.err
  mpirun --oversubscribe -np $p --mca btl self,vader --mca pml ob1 \
    /usr/bin/python3 scripts/bench-mpi.py --sizes $S --json $OUT/ompi-vader-p$p-r$run.json > /dev/null 2>$OUT/ompi-vader-p$p-r$run.err
done; done
/usr/bin/python3 scripts/bench-openmpi-table.py "$OUT"
