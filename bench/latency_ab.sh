#!/usr/bin/env bash
# The partial collectives against MPI_Allreduce for two builds run
# alternately: `partialcoll-bench latency` (4 bytes, 200 calls) at a skew
# step (STEP_MS, default 0: nobody is late) and rank counts (RANKS,
# default "2 4 8").
#
#   bash bench/latency_ab.sh BEFORE_VENV AFTER_VENV [PAIRS [STEP_MS [RANKS]]]
#
# Each venv has its own partialcoll installed.  PAIRS (default 10) rounds;
# which build goes first alternates.  The CSVs go to bench/out/latency_ab/;
# at the end, per P and build, the median time and the median and range of
# the ratio to MPI_Allreduce of every implementation.  At step 0, about
# 7 s a pair.
set -euo pipefail
cd "$(dirname "$0")/.."
USAGE="usage: bench/latency_ab.sh BEFORE_VENV AFTER_VENV [PAIRS [STEP_MS [RANKS]]]"
BEFORE=${1:?$USAGE}
AFTER=${2:?$USAGE}
PAIRS=${3:-10}
STEP=${4:-0}
RANKS=${5:-2 4 8}
OUT=bench/out/latency_ab
. bench/alternate.sh
fresh_out
run() {   # side venv i
    each_rank "$@" lat latency --step-ms "$STEP" --iters 200
}
alternate "$PAIRS" "$BEFORE" "$AFTER"
ratios "$OUT" "$PAIRS" lat avg_ms 1000 - $RANKS
