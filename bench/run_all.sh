#!/usr/bin/env bash
# Reruns the benchmarks behind docs/results.md, in the order of its
# sections (many hours on 2 cores: the MLfabric and TicTac runs take most).
# Run from the repository root with partialcoll installed (pip install
# ".[bench,torch,vision]") in the active environment.  Tables and CSVs go
# to bench/out/ (not committed); the figures the results page shows are
# redrawn in docs/figures/.  Pass a section's name to run only it:
#
#   bash bench/run_all.sh [executor|allreduce|latency|eager|overlap|netcal|rps|aware|tictac|mlfabric]
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out
only=${1:-all}
want() { [ "$only" = all ] || [ "$only" = "$1" ]; }

if want executor; then
    timeout 600 mpiexec -n 2 partialcoll-bench overhead | tee bench/out/overhead_np2.txt
fi
if want allreduce; then
    for n in 2 4; do
        timeout 300 mpiexec -n $n partialcoll-bench sweep --csv bench/out/sweep_np$n.csv | tee bench/out/sweep_np$n.txt
    done
    timeout 900 mpiexec -n 4 partialcoll-bench allreduce -m 8:4M -i 100 -x 10 --csv bench/out/osu_np4.csv | tee bench/out/osu_np4.txt
fi
if want latency; then
    timeout 600 mpiexec -n 8 partialcoll-bench latency --plot docs/figures/latency_np8_linear.png | tee bench/out/latency_np8.txt
    for n in 16 32; do
        timeout 600 mpiexec -n $n partialcoll-bench latency --csv bench/out/lat_np$n.csv | tee bench/out/latency_np$n.txt
    done
    timeout 600 mpiexec -n 8 partialcoll-bench latency --sweep-steps 0,0.1,1,4 --csv bench/out/skew_sweep_np8.csv --plot docs/figures/latency_skew_sweep_np8.png | tee bench/out/skew_sweep_np8.txt
fi
if want eager; then
    timeout 900 mpiexec -n 8 partialcoll-bench hyperplane --csv bench/out/hp8.csv --json bench/out/hp8.json --plot docs/figures/hyperplane_np8.png | tee bench/out/hp8.txt
    timeout 900 mpiexec -n 4 partialcoll-bench hyperplane --csv bench/out/hp4.csv | tee bench/out/hp4.txt
    timeout 900 mpiexec -n 2 partialcoll-bench lstm --batch 32 --epochs 4 --csv bench/out/lstm2.csv --json bench/out/lstm2.json | tee bench/out/lstm2.txt
fi
if want overlap; then
    for n in 2 4; do
        timeout 900 mpiexec -n $n partialcoll-bench overlap --csv bench/out/overlap_np$n.csv | tee bench/out/overlap_np$n.txt
    done
fi
if want netcal; then
    timeout 600 mpiexec -n 3 partialcoll-bench netcal --csv bench/out/netcal_np3.csv | tee bench/out/netcal_np3.txt
fi
if want rps; then
    timeout 1200 mpiexec -n 4 partialcoll-bench rps --csv bench/out/rps4.csv --plot docs/figures/rps_np4.png | tee bench/out/rps4.txt
    timeout 1800 mpiexec -n 8 partialcoll-bench rps --csv bench/out/rps8.csv --plot docs/figures/rps_np8.png | tee bench/out/rps8.txt
    timeout 3000 mpiexec -n 4 partialcoll-bench rps --colocated --iters 300 --hidden 128 --seeds 3 --csv bench/out/rps_colocated4.csv --plot docs/figures/rps_colocated_np4.png | tee bench/out/rps_colocated4.txt
fi
if want aware; then
    # probes sized to the share (the default) and the paper's fixed probes,
    # same seeds, one after the other
    timeout 1800 mpiexec -n 8 partialcoll-bench aware --every 30 --redraws 10 --csv bench/out/aware8_s3.csv --plot docs/figures/aware_np8_probes.png | tee bench/out/aware8_s3.txt
    timeout 1800 mpiexec -n 8 partialcoll-bench aware --every 30 --redraws 10 --min-probe 0 --csv bench/out/aware8_paper_s3.csv --plot docs/figures/aware_np8_30s_slice30k.png | tee bench/out/aware8_paper_s3.txt
    timeout 600 mpiexec -n 8 partialcoll-bench aware --schemes '' --sweep '' --csv bench/out/aware_ovh.csv | tee bench/out/aware_ovh.txt
fi
if want tictac; then
    timeout 5400 mpiexec -n 5 partialcoll-bench tictac --csv bench/out/tictac_np5.csv --json bench/out/tictac_np5.json --plot docs/figures/tictac_np5.png --trace bench/out/tictac_trace | tee bench/out/tictac_np5.txt
    timeout 1800 mpiexec -n 4 partialcoll-bench tictac-allreduce --mode sync --rhos 0.25,0.5,1,1.5,2 --csv bench/out/tictac_ar_sync_np4.csv | tee bench/out/tictac_ar_sync_np4.txt
fi
if want mlfabric; then
    for n in N2 N1 N3; do
        timeout 600 partialcoll-bench mlfabric-sched --sizes 10,100,500,1000 --network $n --csv bench/out/mlfabric_sched_$n.csv | tee bench/out/mlfabric_sched_$n.txt
    done
    for s in 0 1 2; do
        timeout 1500 mpiexec -n 8 partialcoll-bench mlfabric --model mlp --lr 4 --stragglers C1,C2,C3 --networks N1 --server-nic fixed --schemes mlfabric-N,mlfabric-2N,async,ring --seeds $s --csv bench/out/c123_fixed_s$s.csv --curves bench/out/c123_fixed_s${s}_curves.json --plot docs/figures/mlfabric_np8_c123_fixed.png | tee bench/out/c123_fixed_s$s.txt
        timeout 1500 mpiexec -n 8 partialcoll-bench mlfabric --model mlp --lr 4 --stragglers C2 --networks N1,N2,N3 --server-nic fixed --common-target --schemes mlfabric-N,mlfabric-2N,async,ring --seeds $s --curves bench/out/c2_n123_s${s}_curves.json | tee bench/out/c2_n123_s$s.txt
        timeout 1500 mpiexec -n 16 partialcoll-bench mlfabric --model mlp --lr 8 --distributors 2 --distribution one-copy --base-rate 5e6 --server-nic fixed --stragglers C2 --networks N1,N2,N3 --schemes mlfabric-2N,async,ring --seeds $s --curves bench/out/np16_n123_s${s}_curves.json --plot docs/figures/mlfabric_np16_n123_fixed.png | tee bench/out/np16_n123_s$s.txt
    done
    partialcoll-bench mlfabric-retarget bench/out/c2_n123_s{0,1,2}_curves.json | tee bench/out/c2_n123_retarget.txt
fi
