"""Smoke tests of the benchmarks (short runs) at the running comm size."""
import argparse
import contextlib
import io
import json
import pathlib
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

from partialcoll.bench import (aware, breakdown, cnn, hyperplane, latency,
                               lstm,
                               netcal,
                               overhead, overlap, rps, rps_colocated,
                               rps_model, sweep)

pytestmark = pytest.mark.mpi


@pytest.fixture
def rank_tmp():
    """A private directory per rank (pytest's tmp_path is shared, racy)."""
    with tempfile.TemporaryDirectory() as d:
        yield pathlib.Path(d)


def args_for(module, argv):
    p = argparse.ArgumentParser()
    module.add_args(p)
    return p.parse_args(argv)


def test_latency_benchmark_runs_and_counts(rank_tmp):
    out = rank_tmp / "lat.json"
    rows = latency.run(args_for(latency, ["--iters", "6", "--step-ms", "0.2",
                                          "--json", str(out)]))
    if MPI.COMM_WORLD.rank == 0:
        names = [r["impl"] for r in rows]
        assert names[0] == "MPI_Allreduce" and names[-1] == "solo"
        assert all(r["avg_ms"] > 0 for r in rows) and out.exists()
        k = max(1, MPI.COMM_WORLD.size // 2)
        quorum = [r for r in rows if r["impl"].startswith("quorum")][0]
        assert quorum["nap"] != quorum["nap"] or quorum["nap"] >= k  # NaN ok


def test_latency_skew_sweep(rank_tmp):
    """--sweep-steps: every implementation at each step, in one run; each
    step's speed-up is over that step's MPI_Allreduce; the plot is
    written."""
    png = rank_tmp / "sweep.png"
    rows = latency.run(args_for(latency, [
        "--iters", "3", "--warmup", "1", "--sweep-steps", "0,0.2",
        "--impls", "MPI_Allreduce,solo", "--plot", str(png)]))
    assert [(r["step_ms"], r["impl"]) for r in rows] == [
        (0.0, "MPI_Allreduce"), (0.0, "solo"), (0.2, "MPI_Allreduce"),
        (0.2, "solo")]
    for base, solo in (rows[:2], rows[2:]):
        assert base["speedup"] == 1.0
        assert solo["speedup"] == pytest.approx(base["avg_ms"] /
                                                solo["avg_ms"])
    if MPI.COMM_WORLD.rank == 0:
        pytest.importorskip("matplotlib")
        assert png.exists()


def test_round_breakdown_stages():
    """The stages of a round, from its call to its return: none negative,
    the exchange and the bookkeeping take time, and a round at three or
    more ranks sends activation and exchange messages: at a power of two,
    at most log2 P exchange messages, the bookkeeping riding in the
    data's.  At two ranks the data is the activation: no activation
    message (quorum(1) is activated as solo is)."""
    rows = breakdown.run(args_for(breakdown, ["--iters", "20", "--warmup",
                                              "3"]))
    P = MPI.COMM_WORLD.size
    byname = {r["impl"]: r for r in rows}
    assert set(byname) == {"MPI_Allreduce", "allreduce", "solo", "majority",
                           f"quorum(k={max(1, P // 2)})"}
    for name, r in byname.items():
        assert r["untraced_us"] > 0, r
        if name in ("MPI_Allreduce", "allreduce"):
            assert np.isnan(r["flush_us"]), r
            continue
        assert r["flush_us"] > 0, r         # the synchronous round
        # each stage clipped to the call (an activation heard before it
        # began counts from the call on): none negative, the exchange and
        # the locked ops take time
        stages = {s: r[f"{s}_us"] for s in breakdown.STAGES}
        assert all(v >= 0 for v in stages.values()), r
        assert stages["exchange"] > 0 and stages["accounting"] > 0, r
        # at least the activation, the data's copy and reset, the
        # snapshot's bookkeeping callback, the accumulation and the
        # accounting's callback
        assert r["ops"] >= 6, r
        assert 0 <= r["on_caller"] <= r["ops"], r
        if P == 2:             # quorum(1) is activated as solo is
            assert r["x_msgs"] >= 1 and r["act_msgs"] == 0, r
        elif P > 1:
            assert r["x_msgs"] >= 1, r
            assert r["act_msgs"] > 0, r   # majority: the initiator's
        if P & (P - 1) == 0:        # no fold: one message per step (a
            # send still in flight when its round's timeline was read is
            # not counted, hence at most; the bookkeeping in messages of
            # its own would double it)
            assert r["x_msgs"] <= P.bit_length() - 1, r


def test_device_benchmarks_run_on_the_emulated_device(rank_tmp):
    """--device runs the GPU code path of both benchmarks (emulated device:
    no GPU here); results are checked against MPI_Allreduce inside."""
    rows = sweep.run(args_for(sweep, ["--sizes", "8,64K", "--iters", "5",
                                      "--repeat", "1", "--device", "emulate"]))
    assert [r["device"] for r in rows] == ["emulate"] * 2
    # the hand-written staging (copy out, MPI_Allreduce, copy back) too
    assert all(r["hand_avg_us"] > 0 and r["vs_hand"] > 0 for r in rows)
    rows = latency.run(args_for(latency, ["--iters", "4", "--step-ms", "0.1",
                                          "--size", "1200",
                                          "--device", "emulate"]))
    assert [r["impl"] for r in rows][-1] == "solo"
    with pytest.raises(SystemExit, match="NCCL needs --device gpu"):
        latency.run(args_for(latency, ["--iters", "2", "--impls", "nccl"]))


@pytest.mark.max_ranks(4)
def test_cnn_benchmark_runs():
    """partialcoll-bench cnn on the CPU: eager-SGD in sync and solo, then
    DDP over gloo, on the same batches; the replicas agree after flush()
    (checked inside, and sync equals DDP's loss: the same averaged
    gradients from the same start)."""
    pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("sklearn", reason="scikit-learn is not installed")
    rows = cnn.run(args_for(cnn, ["--steps", "6", "--warmup", "2",
                                  "--device", "cpu"]))
    assert [r["variant"] for r in rows] == ["sync", "solo", "ddp"]
    assert all(r["steps_per_s"] > 0 and r["max_diff"] <= 1e-5 * r["max_param"]
               for r in rows)
    assert rows[0]["final_loss"] == pytest.approx(rows[2]["final_loss"],
                                                  rel=1e-4)


def test_sweep_and_overhead_run(rank_tmp):
    rows = sweep.run(args_for(sweep, ["--sizes", "8,4K", "--iters", "20",
                                      "--repeat", "1",
                                      "--csv", str(rank_tmp / "s.csv")]))
    assert [r["bytes"] for r in rows] == [8, 4096]
    rows = overhead.run(args_for(overhead, ["--chain", "1000", "--pairs", "50",
                                            "--iters", "50",
                                            "--idle-seconds", "0.1",
                                            "--objects", "30", "--churn", "30",
                                            "--allreduce-iters", "200"]))
    assert rows[0]["avg"] < 100
    if MPI.COMM_WORLD.rank == 0:
        by = {r["metric"].strip(): r for r in rows}
        # idle objects share the control receives of their communicator,
        # one per rank (at most one more message in flight)
        size = MPI.COMM_WORLD.size
        assert by["outstanding messages with 30 objects open"]["max"] \
            <= size + 1
        assert by["library duplicates before / after the churn"]["avg"] in (
            "2 / 2", "0 / 2", "2 / 0")


@pytest.mark.max_ranks(4)
def test_netcal_rps_and_aware_benchmarks_run():
    """Tiny runs of the network benchmarks: tables come out, results are
    checked inside (exact averages) and the calibration rows are filled."""
    P = MPI.COMM_WORLD.size
    if 2 <= P <= 4:
        rows = netcal.run(args_for(netcal, [
            "--size", "400K", "--chain", "3", "--latency", "5 ms",
            "--messages", "200", "--repeat", "1", "--every", "0.1",
            "--epochs", "2"]))
        if MPI.COMM_WORLD.rank == 0:
            assert {r["row"].split()[0] for r in rows} >= {"one", "latency",
                                                           "drops", "trace"}
    rows = rps.run(args_for(rps, ["--iters", "10", "--every", "5",
                                  "--seeds", "1", "--drops", "0,0.2"]))
    if MPI.COMM_WORLD.rank == 0:
        assert {r["algorithm"] for r in rows} == {"rps", "gradients",
                                                  "allreduce"}
        assert all(r["loss"] > 0 for r in rows)
    rows = aware.run(args_for(aware, [
        "--size", "200kB", "--every", "0.3", "--redraws", "2",
        "--sweep", "20000", "--sweep-iters", "2", "--overhead-iters", "3",
        "--slice", "20000"]))
    if MPI.COMM_WORLD.rank == 0:
        assert {r["part"] for r in rows} >= {"schemes", "overhead"}
        assert {r["scheme"] for r in rows if r["part"] == "overhead"} == \
            {"average", "oracle"}
        # the paper's fixed probes beside ours, in the same run
        assert {r["scheme"] for r in rows if r["part"] == "schemes"} >= \
            {"aware", "aware-paper", "aware/average", "aware-paper/average"}


def test_aware_min_probe_argument():
    """--min-probe: 'auto' (the default), 0 for the paper's fixed probes, a
    number of elements; anything else is argparse's error, not a
    traceback."""
    assert args_for(aware, []).min_probe == "auto"
    assert args_for(aware, ["--min-probe", "0"]).min_probe is None
    assert args_for(aware, ["--min-probe", "2500"]).min_probe == 2500
    for bad in ("-3", "small"):
        with pytest.raises(SystemExit):
            args_for(aware, ["--min-probe", bad])


def test_mlfabric_straggler_ceiling_by_hand():
    """The speed-up that stragglers alone allow: 7 workers in C2 (10 % of
    steps 4x): a worker averages 0.9 + 0.4 = 1.3 per step; an iteration
    waits for a straggler with probability 1 - 0.9^7 = 0.5217, so it
    averages 1 + 3 x 0.5217 = 2.565: 1.973x.  One worker: no wait, 1x; no
    stragglers: 1x; every step slow: 1x.  Bad arguments are errors."""
    from partialcoll.bench.mlfabric import straggler_ceiling
    assert straggler_ceiling(7, 0.10, 4.0) == pytest.approx(
        (1 + 3 * (1 - 0.9 ** 7)) / 1.3)
    assert straggler_ceiling(7, 0.10, 4.0) == pytest.approx(1.973, abs=1e-3)
    assert straggler_ceiling(30, 0.10, 4.0) == pytest.approx(2.979, abs=1e-3)
    for args in ((1, 0.1, 4.0), (7, 0.0, 4.0), (7, 0.1, 1.0), (7, 1.0, 3.0)):
        assert straggler_ceiling(*args) == pytest.approx(1.0)
    for bad in ((0, 0.1, 2.0), (7, 1.5, 2.0), (7, 0.1, 0.5)):
        with pytest.raises(ValueError):
            straggler_ceiling(*bad)


def test_mlfabric_targets_by_hand():
    """Targets: per configuration, the highest of its schemes' lowest
    losses (C2-N1 seed 0: a reaches 0.2, b 0.5, so 0.5; C2-N3 seed 0: 0.9;
    C2-N1 seed 1: 0.3); --common-target: the highest over every
    configuration of the same seed (0.9 for both of seed 0's, 0.3 for seed
    1's alone); --target-loss: that loss everywhere.  Both flags at once
    are refused before anything runs."""
    from partialcoll.bench.mlfabric import targets

    def curve(*losses):
        return {"losses": [(float(i), i, x) for i, x in enumerate(losses)]}
    curves = {("C2", "N1", 0): {"a": curve(1.0, 0.2), "b": curve(0.8, 0.5)},
              ("C2", "N3", 0): {"a": curve(1.0, 0.9), "b": curve(0.4, 2.0)},
              ("C2", "N1", 1): {"a": curve(0.3), "b": curve(0.1)}}
    assert targets(curves) == {("C2", "N1", 0): 0.5, ("C2", "N3", 0): 0.9,
                               ("C2", "N1", 1): 0.3}
    assert targets(curves, common=True) == {
        ("C2", "N1", 0): 0.9, ("C2", "N3", 0): 0.9, ("C2", "N1", 1): 0.3}
    assert set(targets(curves, fixed=0.25).values()) == {0.25}
    assert targets(curves, fixed=0.25, common=True) == targets(curves, 0.25)
    from partialcoll.bench import mlfabric
    with pytest.raises(SystemExit, match="not both"):
        mlfabric.run(args_for(mlfabric, ["--common-target",
                                         "--target-loss", "0.1"]))


def test_mlfabric_retarget(tmp_path, capsys):
    """partialcoll-bench mlfabric-retarget puts runs saved in two files on
    one target: C2-N1 (ring reaches 0.5 at 4 s, mlfabric-2N at 2 s) and
    C2-N3 (ring 0.6 at 6 s, mlfabric-2N 0.6 at 2 s).  Per configuration the
    targets are 0.5 and 0.6 (2.00x and 3.00x); --common takes 0.6 for both
    (ring reaches it at 4 s in C2-N1: 2.00x).  A configuration in two
    files is refused."""
    from partialcoll.bench import mlfabric_retarget as script
    n1 = {"C2-N1 seed 0": {"ring": [[0, 0, 2.0], [4, 9, 0.5]],
                           "mlfabric-2N": [[0, 0, 2.0], [2, 9, 0.4]]}}
    n3 = {"C2-N3 seed 0": {"ring": [[0, 0, 2.0], [6, 9, 0.6]],
                           "mlfabric-2N": [[0, 0, 2.0], [2, 9, 0.6]]}}
    paths = []
    for i, got in enumerate((n1, n3)):
        paths.append(tmp_path / f"c{i}.json")
        paths[-1].write_text(json.dumps(got))
    files = [str(x) for x in paths]
    script.main(files)
    out = capsys.readouterr().out
    assert "C2-N1 seed 0: target 0.5000" in out
    assert "C2-N1: mlfabric-2N over ring, median 2.00" in out
    assert "C2-N3: mlfabric-2N over ring, median 3.00" in out
    script.main(["--common"] + files)
    out = capsys.readouterr().out
    assert "C2-N1 seed 0: target 0.6000" in out
    assert "ring 4.0 s (1.00x)  mlfabric-2N 2.0 s (2.00x)" in out
    script.main(["--configs", "C2-N3"] + files)
    assert "C2-N1" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match="in two files"):
        script.main([files[0], files[0]])
    with pytest.raises(SystemExit, match="not both"):
        script.main(["--common", "--target-loss", "0.5"] + files)


def test_blas_threads_argument_and_cap():
    """--blas-threads: 'auto' (default), 0 (leave BLAS alone) or a count;
    anything else is argparse's error.  A count caps this process's BLAS
    pool inside the with block (threadpoolctl reports it), 'auto' to the
    host's cores over its ranks; 0 gives None and changes nothing; the
    pool is as before after each block."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from partialcoll.bench import mlfabric
    from partialcoll.bench._common import limit_blas
    assert args_for(mlfabric, []).blas_threads == "auto"
    assert args_for(mlfabric, ["--blas-threads", "0"]).blas_threads == 0
    assert args_for(mlfabric, ["--blas-threads", "3"]).blas_threads == 3
    for bad in ("-1", "many"):
        with pytest.raises(SystemExit):
            args_for(mlfabric, ["--blas-threads", bad])
    import numpy  # noqa: F401 (loads its BLAS)

    def pools():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]
    before = pools()
    assert before
    with limit_blas(0, MPI.COMM_WORLD) as cap:
        assert cap is None and pools() == before
    with limit_blas(1, MPI.COMM_WORLD) as cap:
        assert cap == 1 and all(n == 1 for n in pools()), pools()
    assert pools() == before
    with limit_blas("auto", MPI.COMM_WORLD) as cap:
        assert cap >= 1 and all(n == cap for n in pools()), pools()
    assert pools() == before


@pytest.mark.max_ranks(4)
def test_aware_slice_sweep_alone_with_a_per_message_cost(rank_tmp):
    """``--schemes ''``: the slice sweep alone (on a network with a
    per-message cost), one row per slice size, and its plot."""
    png = rank_tmp / "u.png"
    rows = aware.run(args_for(aware, [
        "--size", "200kB", "--sweep", "10000,40000", "--sweep-iters", "2",
        "--schemes", "", "--overhead-iters", "0",
        "--message-overhead", "1 ms", "--plot", str(png)]))
    if MPI.COMM_WORLD.rank == 0:
        assert [(r["part"], r["slice"]) for r in rows] == [
            ("slices", 10000), ("slices", 40000)]
        assert all(r["value"] > 0 for r in rows)
        assert png.exists() or aware.pyplot() is None


@pytest.mark.max_ranks(4)
def test_rps_colocated_benchmark_runs(rank_tmp):
    """A tiny run of the case study beside a service: one row per buffer,
    latencies from the network's clock (positive, at least a transfer's
    time), the smallest buffer drops every learning message, and the plot
    is drawn again from the CSV."""
    P = MPI.COMM_WORLD.size
    if P < 2:
        pytest.skip("needs two ranks (a service between them)")
    out, png = rank_tmp / "co.csv", rank_tmp / "co.png"
    rows = rps.run(args_for(rps, [
        "--colocated", "--iters", "4", "--every", "2", "--hidden", "16",
        "--seeds", "1", "--buffers", "1 KB,unlimited", "--horizon", "3",
        "--service-rate", "50", "--csv", str(out)]))
    if MPI.COMM_WORLD.rank == 0:
        assert [r["buffer"] for r in rows] == ["1 KB", "unlimited"]
        assert rows[0]["learning_dropped"] == pytest.approx(1.0)
        assert rows[1]["learning_dropped"] == pytest.approx(0.0, abs=1e-9)
        for r in rows:
            assert r["messages"] > 0 and r["loss"] > 0
            # 2 KB at 4 MB/s: 0.5 ms at the least
            assert 0.45 < r["service_p50_ms"] <= r["service_p99_ms"] < 1e3
        again = rps.run(args_for(rps, ["--colocated", "--from-csv", str(out),
                                       "--plot", str(png)]))
        assert [r["loss"] for r in again] == pytest.approx(
            [r["loss"] for r in rows])
        assert png.exists() or rps_colocated.pyplot() is None


def test_rps_loss_is_the_average_model_on_all_data():
    """The rps benchmarks' loss (both tables) is the loss of the ranks'
    average model on the whole training set, not each rank's own."""
    comm = MPI.COMM_WORLD
    X, y = rps_model.digits()
    params = rps_model.MLP(8, seed=comm.rank).params       # a different model each
    got = rps_model.evaluate(params, X, y, comm)
    mean = [sum(rps_model.MLP(8, seed=r).params[k] for r in range(comm.size)) /
            comm.size for k in range(4)]
    assert got == pytest.approx(rps_model.MLP.loss(mean, X, y), rel=1e-12)
    if comm.size > 1:
        assert got != pytest.approx(rps_model.MLP.loss(params, X, y), rel=1e-6)


@pytest.mark.max_ranks(4)
def test_hyperplane_benchmark_runs(rank_tmp):
    """A tiny hyperplane run: every mode trains (the loss falls) and the
    table, JSON curves and plot are written."""
    P = MPI.COMM_WORLD.size
    out, png = rank_tmp / "hp.json", rank_tmp / "hp.png"
    rows = hyperplane.run(args_for(hyperplane, [
        "--dim", "64", "--batch", str(16 * P), "--train-samples", "2048",
        "--val-samples", "256", "--steps", "30", "--delays", "5",
        "--modes", "solo,sync,majority", "--eval-every", "10",
        "--json", str(out), "--plot", str(png)]))
    assert [r["mode"] for r in rows] == ["sync", "solo", "majority"]
    assert all(r["steps_per_s"] > 0 and r["val_mse"] < 64 for r in rows), rows
    if MPI.COMM_WORLD.rank == 0:
        doc = json.loads(out.read_text())
        curves = doc["curves"]["5 ms injected delay"]
        assert curves[0]["curve"][0]["val_mse"] > curves[0]["curve"][-1]["val_mse"]
        assert png.exists()


@pytest.mark.max_ranks(4)
def test_lstm_benchmark_runs(rank_tmp):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    P = MPI.COMM_WORLD.size
    rows = lstm.run(args_for(lstm, [
        "--batch", str(4 * P), "--train-samples", "64", "--test-samples",
        "32", "--epochs", "1", "--length-scale", "0.05", "--hidden", "8",
        "--modes", "sync,solo", "--csv", str(rank_tmp / "l.csv")]))
    assert [r["mode"] for r in rows] == ["sync", "solo"]
    assert all(0 <= r["test_acc"] <= 1 and r["steps"] == max(1, 16 // P)
               for r in rows)


@pytest.mark.max_ranks(4)
def test_mlfabric_benchmark_quick(rank_tmp):
    """partialcoll-bench mlfabric --quick: every scheme runs on the same
    network and reports a row; ring's speed-up over itself is 1.
    --curves: each row's time to the target read again from the saved
    curves."""
    if MPI.COMM_WORLD.size < 3:
        pytest.skip("a server and two workers at least")
    import json
    from partialcoll.bench import mlfabric
    path = rank_tmp / "curves.json"
    rows = mlfabric.run(args_for(mlfabric, ["--quick", "--duration", "1",
                                            "--curves", str(path)]))
    if MPI.COMM_WORLD.rank == 0:
        assert [r["scheme"] for r in rows] == list(mlfabric.SCHEMES)
        ring = next(r for r in rows if r["scheme"] == "ring")
        assert ring["speedup"] == 1.0 and ring["drops"] == 0
        assert all(r["final_loss"] > 0 for r in rows)
        curves = json.loads(path.read_text())
        assert list(curves) == ["C2-N2 seed 0"]
        got = curves["C2-N2 seed 0"]
        assert list(got) == list(mlfabric.SCHEMES)
        target = max(min(loss for _, _, loss in c) for c in got.values())
        for r in rows:
            assert r["target"] == round(target, 4)
            t, applied = mlfabric.time_to(got[r["scheme"]], target)
            assert (round(t, 2), applied) == (r["time_s"], r["updates"])


def test_mlfabric_benchmark_server_nic_fixed():
    """--server-nic fixed: the server's NICs keep 10 x the base rate at
    every redraw, while the workers' follow the trace (N3: half of the
    draws at 1 x); 'varied' draws the server's too."""
    import partialcoll as pc
    from partialcoll.bench import mlfabric
    P = MPI.COMM_WORLD.size
    seen = {}
    for mode in ("fixed", "varied"):
        args = args_for(mlfabric, ["--server-nic", mode, "--every", "1",
                                   "--base-rate", "1e6"])
        pc.network.enable(mlfabric.network_config(args, "N3", 0))
        try:
            _, t0 = pc.network.nic_rate(0)
            times = [t0 + k + 0.5 for k in range(40)]
            seen[mode] = {(r, nic): {pc.network.nic_rate(r, nic, t)[0]
                                     for t in times}
                          for r in range(P) for nic in ("out", "in")}
        finally:
            pc.network.disable()
    assert seen["fixed"][(0, "out")] == seen["fixed"][(0, "in")] == {1e7}
    assert seen["varied"][(0, "out")] == {1e6, 1e7}   # 40 draws of N3
    for r in range(1, P):
        assert seen["fixed"][(r, "in")] == {1e6, 1e7}, (r, seen)


@pytest.mark.max_ranks(4)
@pytest.mark.parametrize("shape", ["one-copy", "earliest"])
def test_mlfabric_benchmark_relayed_distribution(capsys, shape):
    """--distribution one-copy / earliest runs and the table's title
    names it; an unknown shape is refused by the parser."""
    if MPI.COMM_WORLD.size < 3:
        pytest.skip("a server and two workers at least")
    from partialcoll.bench import mlfabric
    args = args_for(mlfabric, [
        "--quick", "--duration", "1", "--distributors", "2",
        "--distribution", shape, "--schemes", "mlfabric-2N"])
    rows = mlfabric.run(args)
    if MPI.COMM_WORLD.rank == 0:
        assert rows[0]["out_MBps"] > 0
        assert f"2 distributors ({shape})" in capsys.readouterr().out
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        args_for(mlfabric, ["--distribution", "binomial"])
    with pytest.raises(SystemExit, match=f"{shape} needs --distributors"):
        mlfabric.run(args_for(mlfabric, [
            "--quick", "--duration", "1", "--distribution", shape,
            "--schemes", "mlfabric-2N"]))


@pytest.mark.max_ranks(4)
def test_mlfabric_benchmark_distributors():
    """--distributors 2: the MLfabric rows report the server's outgoing
    MB/s and the copies relays forwarded; async PS relays nothing (it
    answers every pull itself) and ring has no server."""
    if MPI.COMM_WORLD.size < 3:
        pytest.skip("a server and two workers at least")
    from partialcoll.bench import mlfabric
    rows = mlfabric.run(args_for(mlfabric, [
        "--quick", "--duration", "1", "--distributors", "2",
        "--schemes", "mlfabric-2N,async,ring"]))
    if MPI.COMM_WORLD.rank == 0:
        by = {r["scheme"]: r for r in rows}
        assert by["mlfabric-2N"]["out_MBps"] > 0
        # a count, not the NaN of schemes without a server (that relays do
        # forward at run time: test_mlfabric_ps's distribution-tree test)
        relayed = by["mlfabric-2N"]["relayed"]
        assert isinstance(relayed, int) and relayed >= 0, relayed
        assert by["async"]["relayed"] == 0 and by["async"]["out_MBps"] > 0
        assert by["ring"]["out_MBps"] != by["ring"]["out_MBps"]   # nan


@pytest.mark.max_ranks(4)
def test_mlfabric_benchmark_allreduce_variant():
    """--schemes mlfabric-ar,ring: MLfabric's allreduce runs as a scheme
    beside the ring (a second of training each) and reports its scheduler
    time."""
    if MPI.COMM_WORLD.size < 3:
        pytest.skip("a server and two workers at least")
    from partialcoll.bench import mlfabric
    rows = mlfabric.run(args_for(mlfabric, [
        "--quick", "--duration", "1", "--schemes", "mlfabric-ar,ring"]))
    if MPI.COMM_WORLD.rank == 0:
        assert [r["scheme"] for r in rows] == ["mlfabric-ar", "ring"]
        ar = rows[0]
        assert ar["drops"] == 0 and ar["final_loss"] > 0
        assert ar["sched_ms"] >= 0 and ar["comm_ms"] > 0


@pytest.mark.max_ranks(4)
def test_mlfabric_benchmark_mlp_model():
    """--model mlp: the tanh MLP trains under the parameter server and the
    ring (the quick run's 2 s each, at lr 1: at the default 5 the stale
    updates of the parameter server can raise its loss)."""
    if MPI.COMM_WORLD.size < 3:
        pytest.skip("a server and two workers at least")
    from partialcoll.bench import mlfabric
    from partialcoll.mlfabric import TanhMLP
    args = args_for(mlfabric, ["--quick", "--model", "mlp", "--hidden", "8",
                               "--lr", "1", "--schemes", "async,ring"])
    rows = mlfabric.run(args)
    model = mlfabric.make_model(args, 0)
    assert isinstance(model, TanhMLP)
    assert mlfabric.update_bytes(args) == 8 * model.params.size
    if MPI.COMM_WORLD.rank == 0:
        start = model.loss(model.params)
        assert [r["scheme"] for r in rows] == ["async", "ring"]
        assert all(0 < r["final_loss"] < start for r in rows), (rows, start)


@pytest.mark.max_ranks(4)
def test_overlap_benchmark_runs(rank_tmp):
    """partialcoll-bench overlap --quick: both variants of sync and solo
    are timed (sync's copies end equal: checked inside), overlap started
    buckets during backward, plain none; ratios against plain."""
    pytest.importorskip("torch", reason="PyTorch is not installed")
    P = MPI.COMM_WORLD.size
    # on the emulated network (its rate from the measured backward time):
    # this run once hung here after the device benchmark, when that rate
    # froze the network's model (tests/test_netem_model_unit.py)
    rows = overlap.run(args_for(overlap, [
        "--quick", "--steps", "2",
        "--json", str(rank_tmp / "o.json")]))
    if P < 2:
        assert rows == []
        return
    assert [(r["mode"], r["variant"]) for r in rows] == [
        ("sync", "overlap"), ("sync", "plain"), ("solo", "overlap"),
        ("solo", "plain")]
    assert all(r["step_ms"] > 0 and r["buckets"] > 2 for r in rows), rows
    assert all((r["early"] > 0) == (r["variant"] == "overlap")
               for r in rows), rows
    assert all(r["ratio"] == 1.0 for r in rows if r["variant"] == "plain")
    if MPI.COMM_WORLD.rank == 0:
        assert (rank_tmp / "o.json").exists()


def test_allreduce_benchmark_osu_style(rank_tmp, monkeypatch):
    """Every implementation, in and out of place, over a size range: the
    checked results are right (#wrong 0), algbw and busbw follow from the
    time; then a wrong expectation is counted on every element of every
    full allreduce (the check can fail)."""
    from partialcoll.bench import allreduce
    P = MPI.COMM_WORLD.size
    out = rank_tmp / "ar.json"
    rows = allreduce.run(args_for(allreduce, [
        "-m", "8:4K", "-f", "8", "-i", "3", "-x", "1", "--json", str(out)]))
    assert len(rows) == 4 * 5 * 2        # 8, 64, 512, 4096 bytes
    for r in rows:
        assert r["#wrong"] == 0, r
        assert r["min_us"] <= r["time_us"] <= r["max_us"]
        assert r["algbw"] == pytest.approx(r["size"] / r["time_us"] / 1e3)
        assert r["busbw"] == pytest.approx(r["algbw"] * 2 * (P - 1) / P)
    assert {r["place"] for r in rows} == {"in", "out"}
    if MPI.COMM_WORLD.rank == 0:
        assert len(json.loads(out.read_text())["rows"]) == len(rows)
    rows = allreduce.run(args_for(allreduce, [
        "-m", "64:64", "-i", "2", "-x", "0", "-o", "max", "-d", "int64"]))
    assert [r["impl"] for r in rows] == ["MPI_Allreduce"] * 2 + \
        ["allreduce"] * 2 and all(r["#wrong"] == 0 for r in rows)
    monkeypatch.setattr(allreduce, "expected", lambda op, dtype, n: -1)
    rows = allreduce.run(args_for(allreduce, [
        "-m", "64:64", "-i", "1", "-x", "0", "--impls", "allreduce"]))
    assert [r["#wrong"] for r in rows] == [16 * P] * 2
