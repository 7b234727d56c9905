#!/usr/bin/env bash
# Reproduces every figure in bench/RESULTS.md (about 15 minutes on 2 cores).
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
# eager-SGD training benchmarks (issue 4), about 12 more minutes
timeout 900 mpiexec -n 8 partialcoll-bench hyperplane --csv bench/out/hp8.csv --json bench/out/hp8.json --plot bench/hyperplane_np8.png | tee bench/out/hp8.txt
timeout 900 mpiexec -n 4 partialcoll-bench hyperplane --csv bench/out/hp4.csv --json bench/out/hp4.json --plot bench/out/hp4.png | tee bench/out/hp4.txt
timeout 900 mpiexec -n 4 partialcoll-bench hyperplane --framework torch --delays 300 --modes sync,sync-mpi,solo,majority,2 --csv bench/out/hp4_torch.csv | tee bench/out/hp4_torch.txt
timeout 900 mpiexec -n 2 partialcoll-bench lstm --batch 32 --epochs 4 --csv bench/out/lstm2.csv --json bench/out/lstm2.json --plot bench/lstm_np2.png | tee bench/out/lstm2.txt
timeout 900 mpiexec -n 4 partialcoll-bench lstm --batch 64 --epochs 4 --csv bench/out/lstm4.csv --json bench/out/lstm4.json --plot bench/out/lstm_np4.png | tee bench/out/lstm4.txt
