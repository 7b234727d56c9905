#!/usr/bin/env bash
# Reproduces every figure in bench/RESULTS.md (about 3 minutes on 2 cores).
# Run from the repository root with partialcoll installed in the active env.
set -euo pipefail
mkdir -p bench/out
for n in 2 4; do
    timeout 300 mpiexec -n $n partialcoll-bench sweep --csv bench/out/sweep_np$n.csv | tee bench/out/sweep_np$n.txt
    timeout 300 mpiexec -n $n partialcoll-bench overhead | tee bench/out/overhead_np$n.txt
done
timeout 300 mpiexec -n 8 partialcoll-bench latency --json bench/out/latency_np8_linear.json --plot bench/latency_np8_linear.png | tee bench/out/latency_np8_linear.txt
timeout 300 mpiexec -n 8 partialcoll-bench latency --skew random | tee bench/out/latency_np8_random.txt
timeout 300 mpiexec -n 4 partialcoll-bench latency | tee bench/out/latency_np4_linear.txt
