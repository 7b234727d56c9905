#!/usr/bin/env bash
# Reruns the benchmarks behind the figures in docs/results.md (about 70 minutes on 2 cores).
# Run from the repository root with partialcoll installed in the active env.
set -euo pipefail
mkdir -p bench/out
for n in 2 4; do
    timeout 300 mpiexec -n $n partialcoll-bench sweep --csv bench/out/sweep_np$n.csv | tee bench/out/sweep_np$n.txt
    timeout 300 mpiexec -n $n partialcoll-bench overhead | tee bench/out/overhead_np$n.txt
done
timeout 300 mpiexec -n 8 partialcoll-bench latency --json bench/out/latency_np8_linear.json --plot docs/figures/latency_np8_linear.png | tee bench/out/latency_np8_linear.txt
timeout 300 mpiexec -n 8 partialcoll-bench latency --skew random | tee bench/out/latency_np8_random.txt
timeout 300 mpiexec -n 4 partialcoll-bench latency | tee bench/out/latency_np4_linear.txt
# eager-SGD training benchmarks (issue 4), about 12 more minutes
timeout 900 mpiexec -n 8 partialcoll-bench hyperplane --csv bench/out/hp8.csv --json bench/out/hp8.json --plot docs/figures/hyperplane_np8.png | tee bench/out/hp8.txt
timeout 900 mpiexec -n 4 partialcoll-bench hyperplane --csv bench/out/hp4.csv --json bench/out/hp4.json --plot bench/out/hp4.png | tee bench/out/hp4.txt
timeout 900 mpiexec -n 4 partialcoll-bench hyperplane --framework torch --delays 300 --modes sync,sync-mpi,solo,majority,2 --csv bench/out/hp4_torch.csv | tee bench/out/hp4_torch.txt
timeout 900 mpiexec -n 2 partialcoll-bench lstm --batch 32 --epochs 4 --csv bench/out/lstm2.csv --json bench/out/lstm2.json --plot docs/figures/lstm_np2.png | tee bench/out/lstm2.txt
timeout 900 mpiexec -n 4 partialcoll-bench lstm --batch 64 --epochs 4 --csv bench/out/lstm4.csv --json bench/out/lstm4.json --plot bench/out/lstm_np4.png | tee bench/out/lstm4.txt
# network model (issue 11): calibration of the emulated network
timeout 600 mpiexec -n 3 partialcoll-bench netcal --csv bench/out/netcal_np3.csv | tee bench/out/netcal_np3.txt
# RPS (issue 16): training over lossy links, n = 4 and 8, three seeds, and
# the colocated-service case study
timeout 1200 mpiexec -n 4 partialcoll-bench rps --csv bench/out/rps4.csv --plot docs/figures/rps_np4.png | tee bench/out/rps4.txt
timeout 1800 mpiexec -n 8 partialcoll-bench rps --csv bench/out/rps8.csv --plot docs/figures/rps_np8.png | tee bench/out/rps8.txt
timeout 3000 mpiexec -n 4 partialcoll-bench rps --colocated --iters 300 --hidden 128 --seeds 3 --csv bench/out/rps_colocated4.csv --plot docs/figures/rps_colocated_np4.png | tee bench/out/rps_colocated4.txt
# network-aware PS load distribution (issue 17), 8 ranks
timeout 1800 mpiexec -n 8 partialcoll-bench aware --csv bench/out/aware8.csv --plot docs/figures/aware_np8.png | tee bench/out/aware8.txt
# MLfabric's scheduler time per batch (issue 14), one process, about a minute
for n in N2 N1 N3; do
    timeout 600 partialcoll-bench mlfabric-sched --sizes 10,100,500,1000 --network $n --csv bench/out/mlfabric_sched_$n.csv | tee bench/out/mlfabric_sched_$n.txt
done
# overlap of communication with backward (issue 13): step time with and
# without, same run, sync and solo, emulated link calibrated to rho = 1
timeout 900 mpiexec -n 2 partialcoll-bench overlap --csv bench/out/overlap_np2.csv | tee bench/out/overlap_np2.txt
timeout 900 mpiexec -n 4 partialcoll-bench overlap --csv bench/out/overlap_np4.csv | tee bench/out/overlap_np4.txt
