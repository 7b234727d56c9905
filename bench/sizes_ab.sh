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
rm -rf "$OUT"
mkdir -p "$OUT"
run() {   # side venv i
    for P in $RANKS; do
        PATH="$2/bin:$PATH" timeout 600 mpiexec -n "$P" partialcoll-bench \
            allreduce -m "$SIZES" -f 4 -i 30 -x 5 --placement out \
            --csv "$OUT/sz${P}_$1_$3.csv" > /dev/null
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
            with open(f"{out}/sz{P}_{side}_{i}.csv") as f:
                rows = list(csv.DictReader(f))
            base = {r["size"]: float(r["time_us"]) for r in rows
                    if r["impl"] == "MPI_Allreduce"}
            for r in rows:
                us = float(r["time_us"])
                got.setdefault((int(r["size"]), r["impl"]), []).append(
                    (us, us / base[r["size"]]))
        for size in sorted({s for s, _ in got}):
            cells = [f"{k} {statistics.median(t for t, _ in v):.0f} us "
                     f"{statistics.median(x for _, x in v):.2f}x "
                     f"({min(x for _, x in v):.2f}-{max(x for _, x in v):.2f})"
                     for (s, k), v in got.items() if s == size]
            print(f"P={P} {size} B {side}: " + "; ".join(cells))
EOF
