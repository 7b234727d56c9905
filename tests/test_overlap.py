"""Overlap of communication with backward: buckets whose
reductions start from the post-accumulate-grad hooks (EagerOptimizer), at
the running comm size.  DDP's hook: test_eager_ddp.py; the averager's step
in parts: test_overlap_core.py."""
import logging
import random
import time

import numpy as np
import pytest
from mpi4py import MPI

import partialcoll as pc

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(pip install 'partialcoll[torch]')")
import partialcoll.torch as pct  # noqa: E402
from partialcoll.torch import optimizer as eager_torch  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
QUORUM = max(1, P // 2)

torch.set_num_threads(1)
MODES = ["solo", "majority", QUORUM, "sync"]
IDS = ["solo", "majority", "quorum", "sync"]


class Net(torch.nn.Module):
    """Several layers; ``extra`` gets a gradient on some steps only (and
    not on the same steps on every rank)."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(6, 24)
        self.l2 = torch.nn.Linear(24, 24)
        self.l3 = torch.nn.Linear(24, 24)
        self.extra = torch.nn.Linear(24, 24)
        self.out = torch.nn.Linear(24, 1)

    def forward(self, x, use_extra=True):
        h = torch.tanh(self.l1(x))
        h = torch.tanh(self.l2(h))
        h = torch.tanh(self.l3(h))
        if use_extra:
            h = h + torch.tanh(self.extra(h))
        return self.out(h)


def make_net(seed=0):
    torch.manual_seed(seed)
    return Net().double()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]
                     ).numpy().copy()


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randn(5, 6, generator=g, dtype=torch.float64)


def backward(model, step, every_layer=False):
    use_extra = every_layer or (step + RANK) % 3 != 0
    model(batch(step), use_extra).pow(2).mean().backward()


def local_grads(model):
    return {n: (p.grad.detach().clone() if p.grad is not None
                else torch.zeros_like(p))
            for n, p in model.named_parameters()}


def assert_replicas_equal(model):
    w = flat(model)
    np.testing.assert_array_equal(w, COMM.bcast(w))


BUCKET = 2048       # bytes: 24 x 24 float64 weights are 4.6 KB: a bucket each


def wrap(model, mode="sync", overlap=True, opt=None, **kw):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return pct.EagerOptimizer(opt, model.named_parameters(), mode=mode,
                              bucket_bytes=kw.pop("bucket_bytes", BUCKET),
                              overlap=overlap, **kw)


def test_overlap_gives_the_same_parameters_as_reducing_in_step():
    """Sync mode, momentum, several buckets, a layer some ranks skip on
    some steps: overlapped and not, the parameters are bit for bit the
    same after every step (same buckets, same reductions, only started
    earlier), and they are the plain optimizer's on the averaged
    gradients."""
    a, b, ref = make_net(), make_net(), make_net()
    fast, slow = wrap(a, overlap=True), wrap(b, overlap=False)
    plain = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    assert fast.overlap and not slow.overlap
    buckets = fast.averager._buckets
    assert len(buckets) >= 4
    names = [n for n, _ in fast._named]
    # buckets fill in backward's order: the last layer's gradients first
    assert {names[m[0]] for m in buckets[0].members} >= \
        {"out.weight", "out.bias"}
    assert {names[m[0]] for m in buckets[-1].members} >= {"l1.weight"}
    # priorities: the next forward pass needs the first layers first
    assert buckets[-1].priority == 0
    assert buckets[0].priority == max(x.priority for x in buckets)
    for step in range(8):
        for m, o in ((a, fast), (b, slow), (ref, plain)):
            o.zero_grad()
            backward(m, step)
        for p in ref.parameters():
            g = p.grad.numpy().copy() if p.grad is not None else \
                np.zeros(tuple(p.shape))
            COMM.Allreduce(MPI.IN_PLACE, g)
            p.grad = torch.from_numpy(g / P)
        fast.step()
        slow.step()
        plain.step()
        np.testing.assert_array_equal(flat(a), flat(b))
        np.testing.assert_allclose(flat(a), flat(ref), rtol=1e-10,
                                   atol=1e-12)
    assert_replicas_equal(a)
    # during backward: every bucket on the steps where this rank used
    # every layer (5 or 6 of the 8); buckets start in order, so on the
    # others none gets past the bucket holding the unused layer's bias
    early = fast.stats()["started_early"]
    assert early >= 5 * len(buckets), early
    assert slow.stats()["started_early"] == 0
    fast.close()
    slow.close()


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_overlapped_sgd_loses_nothing(mode):
    """Plain SGD, overlap on, random skew, a layer some ranks skip on some
    steps, several buckets in solo and sync (one fused round in majority
    and quorum, started at the last gradient): after flush the replicas
    are identical and w_start - w_end = lr * (every rank's gradients) / P:
    each gradient applied exactly once."""
    model = make_net(RANK)
    pct.broadcast_parameters(model.state_dict(), root_rank=0)
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr = 0.01
    bucketed = mode in ("solo", "sync")
    opt = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                             model.named_parameters(), mode=mode,
                             bucket_bytes=BUCKET if bucketed else None,
                             overlap=True)
    assert opt.overlap
    assert (len(opt.averager._buckets) > 2) == bucketed
    gsum = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    srng = random.Random(RANK)
    steps = 40
    for step in range(steps):
        time.sleep(srng.random() * 0.002)
        opt.zero_grad()
        backward(model, step)
        for n, g in local_grads(model).items():
            gsum[n] += g
        opt.step()
    opt.flush()
    for n, p in model.named_parameters():
        total = gsum[n].numpy().copy()
        COMM.Allreduce(MPI.IN_PLACE, total)
        np.testing.assert_allclose((w0[n] - p.detach()).numpy(),
                                   lr * total / P, rtol=1e-9, atol=1e-11)
    w = flat(model)
    np.testing.assert_allclose(w, COMM.bcast(w), rtol=0, atol=1e-12)
    st = opt.stats()
    assert st["steps"] == steps
    # a rank skipping the extra layer completes no bucket holding it
    # during backward, so only some of the buckets start early then
    assert st["started_early"] >= steps // 3, st
    opt.close()


def test_solo_overlap_keeps_the_straggler_report():
    """Solo, overlap, several buckets: rank P-1 sleeps 20 ms before each
    step; the report (the first bucket's rounds) names it, with the same
    lists on every rank."""
    if P < 2:
        pytest.skip("needs two ranks")
    model = make_net()
    opt = wrap(model, mode="solo", opt=torch.optim.SGD(model.parameters(),
                                                       lr=0.001))
    assert len(opt.averager._buckets) > 2
    step, t_end, go = 0, time.monotonic() + 1.5, True
    while go:
        time.sleep(0.02 if RANK == P - 1 else 0.0002)
        opt.zero_grad()
        backward(model, step)
        opt.step()
        step += 1
        go = time.monotonic() < t_end
    opt.flush()
    st = opt.stats()
    everyone = COMM.allgather((st["late_share"], st["mean_lag"]))
    assert all(e == everyone[0] for e in everyone), everyone
    assert st["slowest"] == P - 1, st
    assert st["late_share"][P - 1] > 0.5, st
    assert st["started_early"] > 0
    opt.close()


N = 3


@pytest.mark.parametrize("loop", ["step-every-pass", "horovod"])
def test_backward_passes_per_step_with_overlap(loop):
    """Sync, N = 3: the buckets leave on the 3rd pass (with the local sum
    of the passes stepped before it) and the parameters equal the
    non-overlapped optimizer's, bit for bit.  (Every layer used in every
    pass: a parameter that misses a pass has fewer than N and waits for
    step(), and so do the buckets after its own.)"""
    a, b = make_net(), make_net()
    fast = wrap(a, overlap=True, backward_passes_per_step=N)
    slow = wrap(b, overlap=False, backward_passes_per_step=N)
    for block in range(3):
        for k in range(N):
            for m, o in ((a, fast), (b, slow)):
                if loop != "horovod":
                    o.zero_grad()
                backward(m, N * block + k, every_layer=True)
                if loop != "horovod":
                    o.step()
            if k < N - 1:
                assert not fast.averager.step_open   # nothing left yet
        if loop == "horovod":
            assert fast.averager.step_open           # left during pass 3
            for o in (fast, slow):
                o.step()
                o.zero_grad()
        np.testing.assert_array_equal(flat(a), flat(b))
    assert fast.stats()["steps"] == 3
    assert fast.stats()["started_early"] == 3 * len(fast.averager._buckets)
    assert_replicas_equal(a)
    fast.close()
    slow.close()


def test_backward_passes_per_step_with_overlap_under_solo_loses_nothing():
    model = make_net()
    opt = wrap(model, mode="solo", backward_passes_per_step=2,
               opt=torch.optim.SGD(model.parameters(), lr=0.05))
    w0, gsum = flat(model), np.zeros(flat(model).shape)
    for step in range(10):
        opt.zero_grad()
        backward(model, step)
        gsum += np.concatenate([g.reshape(-1).numpy() for g in
                                local_grads(model).values()])
        opt.step()
    opt.flush()
    COMM.Allreduce(MPI.IN_PLACE, gsum)
    np.testing.assert_allclose(w0 - flat(model), 0.05 * gsum / P,
                               rtol=1e-9, atol=1e-11)
    assert opt.stats()["steps"] == 5
    opt.close()


def test_clipping_after_synchronize_with_overlap():
    """Horovod's clipping pattern with overlap: synchronize() waits for the
    buckets backward started, the clipped averages are applied; the same
    parameters as without overlap, bit for bit."""
    a, b = make_net(), make_net()
    fast, slow = wrap(a, overlap=True), wrap(b, overlap=False)
    clipped = 0
    for step in range(6):
        norms = []
        for m, o in ((a, fast), (b, slow)):
            o.zero_grad()
            backward(m, step)
            if o is fast:
                assert o.averager.step_open
            info = o.synchronize()
            assert info.step == step + 1
            norms.append(float(torch.nn.utils.clip_grad_norm_(
                m.parameters(), 0.05)))
            with o.skip_synchronize():
                o.step()
        assert norms[0] == norms[1]
        clipped += norms[0] > 0.05
        np.testing.assert_array_equal(flat(a), flat(b))
    assert clipped >= 3
    assert fast.stats()["steps"] == 6
    fast.close()
    slow.close()


def test_an_extra_backward_pass_is_an_error_and_the_step_is_given_up():
    """Two backward passes before one step() with N = 1: the first pass's
    buckets have left, so step() completes them, gives the step up and
    raises on every rank; the optimizer goes on working.  So does a
    backward between synchronize() and step()."""
    a, b = make_net(), make_net()
    fast, slow = wrap(a), wrap(b, overlap=False)
    backward(a, 0)
    backward(a, 1)
    with pytest.raises(pc.ScheduleError, match="2 backward passes before "
                       "step\\(\\), more than backward_passes_per_step=1"):
        fast.step()
    fast.synchronize()      # nothing open: an ordinary step's reduction
    backward(a, 2)
    with pytest.raises(pc.ScheduleError, match="after synchronize"):
        with fast.skip_synchronize():
            fast.step()
    # back to normal: the same as an optimizer that never erred
    b.load_state_dict(a.state_dict())
    slow.optimizer.load_state_dict(fast.optimizer.state_dict())
    for step in range(3, 6):
        for m, o in ((a, fast), (b, slow)):
            o.zero_grad()
            backward(m, step)
            o.step()
    np.testing.assert_array_equal(flat(a), flat(b))
    fast.close()
    slow.close()


def test_a_step_given_up_in_sync_is_as_if_never_reduced(caplog):
    """zero_grad() after backward without step() (e.g. a batch skipped):
    in sync mode the started reductions are completed and dropped: the
    same parameters as without overlap, where nothing was sent."""
    a, b = make_net(), make_net()
    fast, slow = wrap(a), wrap(b, overlap=False)
    with caplog.at_level(logging.WARNING, logger="partialcoll"):
        for step in range(6):
            for m, o in ((a, fast), (b, slow)):
                o.zero_grad()
                backward(m, step)
                if step % 3 == 1:
                    continue        # skipped: zero_grad() at the next step
                o.step()
            np.testing.assert_array_equal(flat(a), flat(b))
    assert fast.stats()["steps"] == slow.stats()["steps"] == 4
    assert len([r for r in caplog.records
                if "zero_grad() before the step" in r.getMessage()]) == 1
    fast.close()
    slow.close()


@pytest.mark.parametrize("how", ["zero_grad", "skip", "flush"])
def test_a_step_given_up_in_solo_is_applied_later(how):
    """Solo: a gradient already in a round cannot be taken back, so a step
    given up (zero_grad() before step(), skip_synchronize() without
    synchronize(), flush() before step()) is applied at this rank's next
    step or flush: plain SGD's updates still sum to every gradient sent
    over P (plus, for skip, this rank's gradients applied unreduced)."""
    model = make_net()
    opt = wrap(model, mode="solo",
               opt=torch.optim.SGD(model.parameters(), lr=0.01))
    w0, sent = flat(model), np.zeros(flat(model).shape)
    local = np.zeros_like(sent)
    rng = random.Random(RANK)
    for step in range(12):
        time.sleep(rng.random() * 0.002)
        opt.zero_grad()
        # every layer used: every bucket has left before step(), so a step
        # given up has all its gradients in rounds already
        model(batch(step)).pow(2).mean().backward()
        assert opt.averager._next == len(opt.averager._buckets)
        g = np.concatenate([x.reshape(-1).numpy() for x in
                            local_grads(model).values()])
        sent += g
        if step % 4 != 2:
            opt.step()
        elif how == "skip":
            local += g
            with opt.skip_synchronize():
                opt.step()
        elif how == "flush":
            opt.flush()
    opt.flush()
    COMM.Allreduce(MPI.IN_PLACE, sent)
    np.testing.assert_allclose(w0 - flat(model), 0.01 * (sent / P + local),
                               rtol=1e-9, atol=1e-11)
    opt.close()


def test_overlap_falls_back_where_it_cannot_run(monkeypatch, caplog):
    model = make_net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    opt = pct.EagerOptimizer(sgd, named, mode="sync-mpi")
    assert not opt.overlap                  # None: quietly off
    opt.close()
    with caplog.at_level(logging.WARNING, logger="partialcoll"):
        opt = pct.EagerOptimizer(sgd, named, mode="sync-mpi", overlap=True)
    assert not opt.overlap
    # the same on every rank: said by rank 0 only
    assert any("no overlap" in r.getMessage()
               for r in caplog.records) == (RANK == 0)
    opt.close()
    monkeypatch.setattr(eager_torch, "hooks_available", lambda: False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="partialcoll"):
        opt = pct.EagerOptimizer(sgd, named, mode="sync", overlap=True)
    assert not opt.overlap
    assert any("post-accumulate-grad" in r.getMessage()
               for r in caplog.records) == (RANK == 0)
    backward(model, 0)
    opt.step()                              # works, reducing in step()
    assert opt.stats()["started_early"] == 0
    opt.close()
    monkeypatch.undo()
    with pytest.raises(pc.ScheduleError, match="overlap must be"):
        pct.EagerOptimizer(sgd, named, overlap="yes")
    if P > 1:
        with pytest.raises(pc.ScheduleError, match="overlap: rank 0="):
            pct.EagerOptimizer(sgd, named, mode="sync", overlap=RANK == 0)
    COMM.Barrier()


def test_default_buckets_and_overlap():
    """Defaults: overlap on (CPU, torch >= 2.1), 25 MiB buckets in solo and
    sync, one bucket in majority."""
    model = make_net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for mode in ("sync", "solo", "majority"):
        opt = pct.EagerOptimizer(sgd, model.named_parameters(), mode=mode)
        assert opt.overlap and len(opt.averager._buckets) == 1
        opt.close()
    big = torch.nn.Linear(2048, 4096)      # 32 MiB of float32 weights
    opt = pct.EagerOptimizer(torch.optim.SGD(big.parameters(), lr=0.1),
                             big.named_parameters(), mode="sync")
    assert len(opt.averager._buckets) == 2
    opt.close()
