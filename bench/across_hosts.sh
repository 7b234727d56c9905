#!/usr/bin/env bash
# partialcoll-bench sweep and latency across emulated hosts (tests/cluster.py:
# Linux namespaces, messages between hosts through MPICH's OFI module over
# TCP on the loopback network), beside the same commands on one host (shared
# memory), alternating so that both see the same machine.  Needs root.
#
#   bash bench/across_hosts.sh [ROUNDS]
#
# Per round: one host at P = 4 and 8, then 2 hosts x 2 and 2 hosts x 4.
# Outputs go to bench/out/hosts/ (CSV and the printed tables).  All ranks
# share this machine's cores: across hosts adds TCP's cost per message, not
# a real network's latency.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
OUT=bench/out/hosts
mkdir -p "$OUT"
export FI_PROVIDER=tcp
bench() {    # where P tag subcommand args...
    local where=$1 p=$2 tag=$3
    shift 3
    local csv="$OUT/${tag}_${where}.csv"
    if [ "$where" = one ]; then
        timeout 600 mpiexec -n "$p" partialcoll-bench "$@" --csv "$csv"
    else
        local per=$((p / 2))
        timeout 700 python tests/cluster.py --hosts 2 --per-host "$per" \
            --netmod ofi --timeout 600 -- partialcoll-bench "$@" --csv "$csv"
    fi > "$OUT/${tag}_${where}.txt"
}
for r in $(seq 1 "$ROUNDS"); do
    for p in 4 8; do
        for where in one two; do
            bench "$where" "$p" "sweep_np${p}_r$r" sweep --repeat 3
            bench "$where" "$p" "latency_np${p}_r$r" latency \
                --impls MPI_Allreduce,allreduce,solo,majority
        done
    done
    echo "round $r of $ROUNDS done"
done
