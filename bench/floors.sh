#!/usr/bin/env bash
# The floors of docs/results.md for two builds, run alternately so that both
# see the same machine: allreduce against MPI_Allreduce (sweep, 2 and 4
# ranks), solo and majority under linear skew (latency, 8 ranks), and the
# executor's overheads (idle CPU, 1,000 idle objects; 2 ranks).
#
#   bash bench/floors.sh BEFORE_VENV AFTER_VENV [PAIRS]
#
# Each venv has its own partialcoll installed (e.g. one made from a
# worktree of the older commit).  PAIRS (default 5) rounds of sweep and
# latency, one of overhead; the outputs go to bench/out/floors/ and the
# medians of every figure, before and after, are printed at the end.  Run
# it on an otherwise idle machine: it takes about 4 minutes a pair.
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=${1:?usage: bench/floors.sh BEFORE_VENV AFTER_VENV [PAIRS]}
AFTER=${2:?usage: bench/floors.sh BEFORE_VENV AFTER_VENV [PAIRS]}
PAIRS=${3:-5}
OUT=bench/out/floors
mkdir -p "$OUT"
run() {   # side venv i
    local side=$1 venv=$2 i=$3
    export PATH="$venv/bin:$PATH"
    timeout 300 mpiexec -n 2 partialcoll-bench sweep \
        --csv "$OUT/sweep2_${side}_$i.csv" > "$OUT/sweep2_${side}_$i.txt"
    timeout 300 mpiexec -n 4 partialcoll-bench sweep \
        --csv "$OUT/sweep4_${side}_$i.csv" > "$OUT/sweep4_${side}_$i.txt"
    timeout 300 mpiexec -n 8 partialcoll-bench latency \
        --impls MPI_Allreduce,solo,majority \
        --csv "$OUT/latency8_${side}_$i.csv" > "$OUT/latency8_${side}_$i.txt"
}
for i in $(seq 1 "$PAIRS"); do
    # alternate which goes first, so neither always runs on a warm machine
    if [ $((i % 2)) = 1 ]; then
        (run before "$BEFORE" "$i"); (run after "$AFTER" "$i")
    else
        (run after "$AFTER" "$i"); (run before "$BEFORE" "$i")
    fi
    echo "pair $i of $PAIRS done"
done
for side in before after; do
    venv=$BEFORE; [ $side = after ] && venv=$AFTER
    (export PATH="$venv/bin:$PATH"
     timeout 600 mpiexec -n 2 partialcoll-bench overhead \
         --csv "$OUT/overhead2_$side.csv" > "$OUT/overhead2_$side.txt")
done
python3 - "$OUT" "$PAIRS" <<'EOF'
import csv, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])

def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))

def sweep(n, size, side):
    return [float(r["ratio"]) for i in range(1, pairs + 1)
            for r in rows(f"{out}/sweep{n}_{side}_{i}.csv") if r["size"] == size]

def latency(impl, side):
    return [float(r["speedup"]) for i in range(1, pairs + 1)
            for r in rows(f"{out}/latency8_{side}_{i}.csv") if r["impl"] == impl]

def overhead(metric, side):
    return [r["avg"] for r in rows(f"{out}/overhead2_{side}.csv")
            if r["metric"].strip().startswith(metric)]

print(f"| figure (median of {pairs} runs; overhead: 1) | before | after |")
print("| --- | --- | --- |")
for n in (2, 4):
    for size in ("8B", "4MiB"):
        b, a = sweep(n, size, "before"), sweep(n, size, "after")
        print(f"| allreduce / MPI_Allreduce, {size}, np={n} | "
              f"{statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f}) | "
              f"{statistics.median(a):.2f} ({min(a):.2f}-{max(a):.2f}) |")
for impl in ("solo", "majority"):
    b, a = latency(impl, "before"), latency(impl, "after")
    print(f"| {impl} speed-up over MPI_Allreduce, P = 8 | "
          f"{statistics.median(b):.2f}x ({min(b):.2f}-{max(b):.2f}) | "
          f"{statistics.median(a):.2f}x ({min(a):.2f}-{max(a):.2f}) |")
for metric in ("NOP chain, per op", "progress thread CPU, idle",
               "ratio (target", "progress thread CPU, 1000 idle"):
    b, a = overhead(metric, "before"), overhead(metric, "after")
    if b and a:
        print(f"| {metric} | {b[0]} | {a[0]} |")
EOF
