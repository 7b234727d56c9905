#!/usr/bin/env bash
# Two builds run alternately over message sizes: `partialcoll-bench
# allreduce` (out of place, float32 sum) at rank counts RANKS (default
# "2 4") and sizes SIZES (default 256K:4M, every factor of 4).
#
#   bash bench/sizes_ab.sh BEFORE_VENV AFTER_VENV [PAIRS [RANKS [SIZES]]]
#
# Each venv has its own partialcoll installed.  PAIRS (default 3) rounds;
# which build goes first alternates.  The CSVs go to bench/out/sizes_ab/;
# at the end, per P, size and build, the median time of every
# implementation and the median and range of its ratio to MPI_Allreduce
# in the same run.  About 30 s a pair at the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
USAGE="usage: bench/sizes_ab.sh BEFORE_VENV AFTER_VENV [PAIRS [RANKS [SIZES]]]"
BEFORE=${1:?$USAGE}
AFTER=${2:?$USAGE}
PAIRS=${3:-3}
RANKS=${4:-2 4}
SIZES=${5:-256K:4M}
OUT=bench/out/sizes_ab
. bench/alternate.sh
fresh_out
run() {   # side venv i
    LIMIT=600 each_rank "$@" sz allreduce -m "$SIZES" -f 4 -i 30 -x 5 \
        --placement out
}
alternate "$PAIRS" "$BEFORE" "$AFTER"
ratios "$OUT" "$PAIRS" sz time_us 1 size $RANKS
