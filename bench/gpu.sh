#!/usr/bin/env bash
# The GPU rows of the results, in one run, on a machine with an NVIDIA GPU,
# CuPy and a CUDA torch, several cores, and no network access.
#
#   bash bench/gpu.sh [OUT_DIR [STEPS]]   (default bench/out/gpu, all steps:
#                                          "1 2 3 4 5")
#
# What it needs beside this tree, in .whl/ (wheels for the machine's
# Python): mpich, mpi4py, jsonschema and what it needs (jsonschema-
# specifications, referencing, rpds-py), pytest-mpi, and setuptools and
# wheel to build with.  It builds partialcoll against the mpich wheel, starts
# NVIDIA's MPS daemon (ranks share the GPU), then, each step in its own
# time limit and its output kept in OUT_DIR as it goes, in this order:
#   1. the floor of a small staged call: one 8-byte copy each way between
#      device and pinned host memory, waited for, 2 ranks sharing the GPU;
#      the allreduce sweep on device buffers, 2 ranks, 8 B to 64 MiB, with
#      the small-message host path off (PARTIALCOLL_GPU_HOST_BYTES=0), at
#      its default, and at 4 MiB;
#   2. the latency benchmark at P = 8, 16 (one rank per core) and 32, host
#      buffers, no skew and 1 ms linear skew;
#   3. the CNN benchmark on the GPU: eager-SGD sync and solo against DDP;
#   4. the device, tensor, 16-bit and compression tests at P = 1 and 2.
set -u
# PYTHONSAFEPATH: the source tree in the current folder never shadows the
# built package
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
OUT_DIR=$(mkdir -p "${1:-bench/out/gpu}" && cd "${1:-bench/out/gpu}" && pwd)
STEPS=" ${2:-1 2 3 4 5} "
step() { [[ $STEPS == *" $1 "* ]]; }
LOG=$OUT_DIR/gpu.log
cd "$(dirname "$0")/.."
exec > >(tee -a "$LOG") 2>&1
say() { echo "== $(date -u +%H:%M:%S) $*"; }

say "the machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
echo "cores: $(nproc)"; python3 --version

say "set-up: MPICH from its wheel, the other wheels, partialcoll built"
M=/tmp/pc-mpich
rm -rf "$M" /tmp/pc-site /tmp/pc-build
mkdir -p "$M"
python3 -m zipfile -e .whl/mpich-*.whl "$M"
MP=$(echo "$M"/mpich-*.data/data)
chmod +x "$MP"/bin/*
export PATH=$MP/bin:$PATH LD_LIBRARY_PATH=$MP/lib:${LD_LIBRARY_PATH:-}
export MPI4PY_MPIABI=mpich MPI4PY_LIBMPI=$MP/lib/libmpi.so.12
python3 -m pip install -q --no-index --no-deps --no-compile --target \
    /tmp/pc-build .whl/setuptools-*.whl .whl/wheel-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target \
    /tmp/pc-site .whl/mpi4py-*.whl .whl/jsonschema*.whl \
    .whl/referencing-*.whl .whl/rpds_py-*.whl .whl/pytest_mpi-*.whl || exit 1
MPICC=$MP/bin/mpicc PYTHONPATH=/tmp/pc-build python3 -m pip install -q \
    --no-deps --no-build-isolation --no-compile --upgrade --target \
    /tmp/pc-site . ||
    exit 1
export PYTHONPATH=/tmp/pc-site
python3 -c "import partialcoll, cupy, torch; print(partialcoll.__version__, \
cupy.__version__, torch.__version__, partialcoll.gpu_path())" || exit 1
BENCH="python3 -m partialcoll.bench"

say "MPS"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/pc-mps CUDA_MPS_LOG_DIRECTORY=/tmp/pc-mps
mkdir -p /tmp/pc-mps
if nvidia-cuda-mps-control -d; then MPS=on; else MPS=off; fi
echo "MPS $MPS"

if step 1; then
say "1. the floor: 8-byte copies between device and pinned host memory"
cat > /tmp/pc-floor.py <<'PY'
import time
import cupy as cp
import cupyx
import numpy as np
from mpi4py import MPI
d, h = cp.ones(2, np.float32), cupyx.empty_pinned(2, np.float32)
s = cp.cuda.get_current_stream()
for what in ("to host", "from host", "both"):
    ts = []
    for _ in range(2000):
        t0 = time.perf_counter()
        if what != "from host":
            d.get(out=h, stream=s, blocking=True)
        if what != "to host":
            d.set(h, stream=s)
            s.synchronize()
        ts.append(time.perf_counter() - t0)
    med = MPI.COMM_WORLD.gather(np.median(ts) * 1e6)
    if MPI.COMM_WORLD.rank == 0:
        print(f"8-byte copy {what}, waited for: median "
              f"{', '.join(f'{m:.1f}' for m in med)} us (rank 0, 1)")
PY
timeout 60 mpiexec -n 2 python3 /tmp/pc-floor.py
say "1. allreduce sweep on device buffers, 2 ranks"
SIZES=8,64,512,4K,32K,64K,256K,1M,4M,16M,64M
PARTIALCOLL_GPU_HOST_BYTES=0 timeout 150 mpiexec -n 2 $BENCH sweep \
    --device gpu --sizes 8,4K,64K,256K,1M --csv "$OUT_DIR/sweep_off.csv"
timeout 200 mpiexec -n 2 $BENCH sweep --device gpu --sizes $SIZES \
    --csv "$OUT_DIR/sweep.csv"
PARTIALCOLL_GPU_HOST_BYTES=4194304 timeout 100 mpiexec -n 2 $BENCH sweep \
    --device gpu --sizes 256K,1M,4M --csv "$OUT_DIR/sweep_4m.csv"
fi

if step 2; then
say "2. latency, host buffers, one rank per core"
for n in 8 16; do
    timeout 120 mpiexec -n $n $BENCH latency --sweep-steps 0,1 \
        --csv "$OUT_DIR/latency_np$n.csv"
done
fi

if step 3; then
say "3. CNN: eager-SGD on the GPU against DDP (gloo), 2 ranks"
timeout 150 mpiexec -n 2 $BENCH cnn --modes sync,solo --steps 300 \
    --csv "$OUT_DIR/cnn.csv"
fi

step 4 && say "4. the GPU tests" && (cd tests && for n in 2 1; do
    timeout 200 mpiexec -n $n python3 -m pytest -q -p no:cacheprovider \
        --with-mpi -m mpi test_device.py test_tensors.py test_half.py \
        test_horovod_compression.py test_partial_compression.py 2>&1 | tail -n 25
done)

if step 5; then
say "5. latency at P = 32 (two ranks per core)"
timeout 120 mpiexec -n 32 $BENCH latency --sweep-steps 0,1
fi

[ "$MPS" = on ] && echo quit | nvidia-cuda-mps-control
say "done"
