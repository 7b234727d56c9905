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
rm -rf "$OUT"
mkdir -p "$OUT"
run() {   # side venv i
    for P in $RANKS; do
        PATH="$2/bin:$PATH" timeout 300 mpiexec -n "$P" partialcoll-bench \
            latency --step-ms "$STEP" --iters 200 \
            --csv "$OUT/lat${P}_$1_$3.csv" > /dev/null
    done
}
for i in $(seq 1 "$PAIRS"); do
    if [ $((i % 2)) = 1 ]; then
        run before "$BEFORE" "$i"; run after "$AFTER" "$i"
    else
        run after "$AFTER" "$i"; run before "$BEFORE" "$i"
    fi
done
python3 - "$OUT" "$PAIRS" $RANKS <<'EOF'
import csv, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
for P in map(int, sys.argv[3:]):
    for side in ("before", "after"):
        got = {}
        for i in range(1, pairs + 1):
            with open(f"{out}/lat{P}_{side}_{i}.csv") as f:
                rows = list(csv.DictReader(f))
            base = next(float(r["avg_ms"]) for r in rows
                        if r["impl"] == "MPI_Allreduce")
            for r in rows:
                ms = float(r["avg_ms"])
                got.setdefault(r["impl"], []).append((ms * 1e3, ms / base))
        cells = [f"{k} {statistics.median(t for t, _ in v):.0f} us "
                 f"{statistics.median(x for _, x in v):.2f}x "
                 f"({min(x for _, x in v):.2f}-{max(x for _, x in v):.2f})"
                 for k, v in got.items()]
        print(f"P={P} {side}: " + "; ".join(cells))
EOF
