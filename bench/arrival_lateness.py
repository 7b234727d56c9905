"""How late a receive's t_done is behind the emulated network's arrival,
and its t_arrive: ``mpiexec -n 4 python bench/arrival_lateness.py MODE
[rounds]``.  Rank 0 sends a forecast (4 bytes) then 10 slices of 80 KB to
rank 1 over a 10 MB/s, 2 ms link; message k arrives (model) at
t_s + bytes so far / rate + latency, t_s the sender's START_AT.  MODE:
``idle`` (ranks 2.. sleep), ``busy`` (every rank but 0 spins Python),
``stop`` (rank 2 stops rank 1 with SIGSTOP for 20 ms, twice).  Prints the
lateness of t_done and of t_arrive, and the link's rate measured with each
(bytes / (last arrival - forecast arrival)) against 10 MB/s, per round.
(Issue 17, see RESULTS.)"""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import partialcoll as pc

mode = sys.argv[1] if len(sys.argv) > 1 else "idle"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
COMM = MPI.COMM_WORLD
RANK = COMM.rank
RATE, LATENCY, K, C = 10e6, 0.002, 10, 20_000
pc.network.enable({"default": {"out_rate": "unlimited",
                               "in_rate": "unlimited", "latency": "2 ms"},
                   "rank": {"0": {"out_rate": "10 MB/s"}}})
comm = COMM.Dup()
pids = COMM.allgather(os.getpid())
fc, data = np.zeros(1, np.float32), np.zeros(K * C, np.float32)
late = {"t_done": [], "t_arrive": []}
rate = {"t_done": [], "t_arrive": []}
for _ in range(rounds):
    s, go, recvs = pc.Schedule(comm), np.zeros(1), []
    if RANK == 0:
        st = s.start_at(s.buffer(go)[0:1])
        s.send(s.buffer(fc), 1, tag=1, after=[st])
        for k in range(K):
            s.send(s.buffer(data)[k * C:(k + 1) * C], 1, tag=2 + k,
                   after=[st])
    elif RANK == 1:
        recvs.append(s.recv(s.buffer(fc), 0, tag=1))
        for k in range(K):
            recvs.append(s.recv(s.buffer(data)[k * C:(k + 1) * C], 0,
                                tag=2 + k))
    s.commit()
    t0 = go[0] = COMM.bcast(pc.now() + 0.02 if RANK == 0 else None)
    req = s.post() if RANK in (0, 1) else None
    end = t0 + (4 + K * C * 4) / RATE + 0.05
    if mode == "busy" and RANK != 0:
        while pc.now() < end:
            pass
    elif mode == "stop" and RANK == 2:
        for at in (0.025, 0.055):
            time.sleep(max(0.0, t0 + at - pc.now()))
            os.kill(pids[1], signal.SIGSTOP)
            time.sleep(0.02)
            os.kill(pids[1], signal.SIGCONT)
    elif RANK >= 2:
        time.sleep(max(0.0, end - pc.now()))
    if req is not None:
        req.wait()
    out = s.outcomes()
    t_s = COMM.bcast(float(out.t_done[0]) if RANK == 0 else None)
    if RANK == 1:
        want = t_s + (4 + np.arange(K + 1) * C * 4) / RATE + LATENCY
        for key in late:
            t = getattr(out, key)[recvs]
            late[key].extend(t - want)
            rate[key].append(K * C * 4 / (t[-1] - t[0]) / RATE - 1)
    s.free()
    COMM.Barrier()
if RANK == 1:
    for key in late:
        e = np.array(late[key]) * 1e3
        print(f"{mode} P={COMM.size} {key:8s} - model arrival (ms): median "
              f"{np.median(e):.3f}, p90 {np.percentile(e, 90):.3f}, max "
              f"{e.max():.3f}; link rate error per round (%): "
              + " ".join(f"{100 * x:+.1f}" for x in rate[key]), flush=True)
pc.network.disable()
