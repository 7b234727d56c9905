#!/usr/bin/env bash
# The full allreduce against MPI_Allreduce at its two ends (8 B and
# 4 MiB) for two builds run alternately: `partialcoll-bench sweep` at rank
# counts RANKS (default "2 4").
#
#   bash bench/sweep_ab.sh BEFORE_VENV AFTER_VENV [PAIRS [RANKS]]
#
# Each venv has its own partialcoll installed.  PAIRS (default 10) rounds;
# which build goes first alternates.  The CSVs go to bench/out/sweep_ab/;
# at the end, per P, size and build, the median and range of the ratio
# partialcoll / MPI_Allreduce over the runs.  About 12 s a pair.
set -euo pipefail
cd "$(dirname "$0")/.."
USAGE="usage: bench/sweep_ab.sh BEFORE_VENV AFTER_VENV [PAIRS [RANKS]]"
BEFORE=${1:?$USAGE}
AFTER=${2:?$USAGE}
PAIRS=${3:-10}
RANKS=${4:-2 4}
OUT=bench/out/sweep_ab
. bench/alternate.sh
fresh_out
run() {   # side venv i
    each_rank "$@" sweep sweep
}
alternate "$PAIRS" "$BEFORE" "$AFTER"
python3 - "$OUT" "$PAIRS" $RANKS <<'PY'
import csv, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
for P in sys.argv[3:]:
    for size in ("8B", "4MiB"):
        for side in ("before", "after"):
            got = []
            for i in range(1, pairs + 1):
                with open(f"{out}/sweep{P}_{side}_{i}.csv") as f:
                    got += [float(r["ratio"]) for r in csv.DictReader(f)
                            if r["size"] == size]
            print(f"P={P} {size} {side}: {statistics.median(got):.2f}x "
                  f"({min(got):.2f}-{max(got):.2f}) over {len(got)} runs")
PY
