"""The eager optimizer's Horovod API (partialcoll.torch.EagerOptimizer):
synchronize / skip_synchronize, op, gradient_predivide_factor,
backward_passes_per_step and the wrapped optimizer's class, at the running
comm size."""
import logging

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(pip install 'partialcoll[torch]')")
import partialcoll as pc  # noqa: E402
import partialcoll.torch as pct  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(5)]
COMM = MPI.COMM_WORLD
P, RANK = COMM.size, COMM.rank
torch.set_num_threads(1)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 1)).double()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]
                     ).numpy().copy()


def backward(model, step):
    """This rank's loss of ``step`` (different data on every rank)."""
    g = torch.Generator().manual_seed(100 * step + RANK)
    x = torch.randn(5, 6, generator=g, dtype=torch.float64)
    model(x).pow(2).mean().backward()


def average_grads_by_hand(model, op="average"):
    for p in model.parameters():
        g = p.grad.numpy().copy()
        COMM.Allreduce(MPI.IN_PLACE, g)
        p.grad = torch.from_numpy(g / P if op == "average" else g)


def assert_replicas_equal(model):
    w = flat(model)
    np.testing.assert_allclose(w, COMM.bcast(w), rtol=1e-12, atol=1e-12)


def momentum(ps):
    return torch.optim.SGD(ps, lr=0.05, momentum=0.9)


# -- the wrapped optimizer's class --------------------------------------------
def test_the_wrapper_is_an_instance_of_the_wrapped_class():
    model = make_model()
    sgd = pct.EagerOptimizer(momentum(model.parameters()),
                             model.named_parameters(), mode="sync")
    adam = pct.EagerOptimizer(torch.optim.Adam(model.parameters()),
                              model.named_parameters(), mode="sync")
    assert isinstance(sgd, torch.optim.SGD) and \
        isinstance(sgd, pct.EagerOptimizer)
    assert not isinstance(sgd, torch.optim.Adam)
    assert isinstance(adam, torch.optim.Adam) and \
        not isinstance(adam, torch.optim.SGD)
    again = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               model.named_parameters(), mode="sync")
    assert type(again) is type(sgd)             # one class per wrapped class
    assert type(sgd).__name__ == "EagerSGD"
    assert repr(sgd).startswith("EagerOptimizer(mode='sync', SGD (")
    # it still behaves as the wrapper: shared state, scheduler, refusals
    sched = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)
    sgd.zero_grad()
    backward(model, 0)
    sgd.step()
    sched.step()
    assert sgd.param_groups[0]["lr"] == sgd.optimizer.param_groups[0]["lr"] \
        == 0.025
    assert sgd.state is sgd.optimizer.state and len(sgd.state) == 4
    sgd.load_state_dict(sgd.state_dict())
    assert sgd.state is sgd.optimizer.state
    with pytest.raises(pc.ScheduleError, match="parameter group"):
        sgd.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    assert sgd.last_step.step == 1 and sgd.stats()["steps"] == 1
    for o in (sgd, adam, again):
        o.close()


# -- synchronize() and skip_synchronize() -------------------------------------
def test_clipping_after_synchronize_equals_clipping_the_average_by_hand():
    """Horovod's pattern in sync mode: synchronize(), clip the averaged
    gradients, step() inside skip_synchronize().  The parameters equal a
    plain optimizer's fed the average clipped by hand, on every rank, and
    each step reduced once."""
    a, b = make_model(), make_model()
    opt = pct.EagerOptimizer(momentum(a.parameters()), a.named_parameters(),
                             mode="sync")
    ref = momentum(b.parameters())
    max_norm, clipped = 0.05, 0
    for step in range(8):
        opt.zero_grad()
        ref.zero_grad()
        backward(a, step)
        backward(b, step)
        info = opt.synchronize()
        assert info.step == step + 1
        norm_a = torch.nn.utils.clip_grad_norm_(a.parameters(), max_norm)
        with opt.skip_synchronize():
            opt.step()
        average_grads_by_hand(b)
        norm_b = torch.nn.utils.clip_grad_norm_(b.parameters(), max_norm)
        assert float(norm_a) == pytest.approx(float(norm_b), rel=1e-12)
        clipped += float(norm_b) > max_norm
        ref.step()
    assert clipped >= 4                     # the clipping did something
    np.testing.assert_allclose(flat(a), flat(b), rtol=1e-10, atol=1e-12)
    assert_replicas_equal(a)
    assert opt.stats()["steps"] == 8        # one reduction per step
    opt.close()


@pytest.mark.parametrize("mode", ["solo", "sync"])
def test_a_step_after_synchronize_never_reduces_twice(mode, caplog):
    """step() without skip_synchronize() after synchronize() applies the
    averages already there (and warns once), a second synchronize() does
    nothing: plain SGD's updates still sum to -lr * (every rank's
    gradients) / P after flush, each gradient reduced once."""
    model = make_model()
    opt = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             model.named_parameters(), mode=mode)
    w0, gsum = flat(model), np.zeros(flat(model).shape)
    with caplog.at_level(logging.WARNING, logger="partialcoll"):
        for step in range(4):
            opt.zero_grad()
            backward(model, step)
            gsum += torch.cat([p.grad.reshape(-1)
                               for p in model.parameters()]).numpy()
            first = opt.synchronize()
            assert opt.synchronize() is first       # a no-op
            opt.step()                              # warns once
    warned = [r for r in caplog.records if "outside skip_synchronize" in
              r.getMessage()]
    assert len(warned) == 1
    assert opt.stats()["steps"] == 4
    opt.flush()
    COMM.Allreduce(MPI.IN_PLACE, gsum)
    np.testing.assert_allclose(w0 - flat(model), 0.1 * gsum / P, rtol=1e-9,
                               atol=1e-11)
    opt.close()


def test_skip_synchronize_alone_applies_this_ranks_gradients():
    """As in Horovod: a step() inside skip_synchronize() with no
    synchronize() before it reduces nothing."""
    a, b = make_model(), make_model()
    opt = pct.EagerOptimizer(torch.optim.SGD(a.parameters(), lr=0.1),
                             a.named_parameters(), mode="sync")
    ref = torch.optim.SGD(b.parameters(), lr=0.1)
    for m, o in ((a, opt), (b, ref)):
        backward(m, 0)
        if o is opt:
            with opt.skip_synchronize():
                opt.step()
        else:
            o.step()
    np.testing.assert_array_equal(flat(a), flat(b))
    assert opt.stats()["steps"] == 0 and opt.last_step is None
    opt.close()


# -- op and gradient_predivide_factor -----------------------------------------
@pytest.mark.parametrize("op,summing", [
    ("average", False), (pct.Average, False), ("sum", True), (pct.Sum, True),
    (pc.SUM, True), (MPI.SUM, True), ("SUM", True)],
    ids=["average", "Average", "sum", "Sum", "pc.SUM", "MPI.SUM", "upper"])
def test_op_average_or_sum(op, summing):
    a, b = make_model(), make_model()
    opt = pct.EagerOptimizer(momentum(a.parameters()), a.named_parameters(),
                             mode="sync", op=op)
    ref = momentum(b.parameters())
    for step in range(3):
        for m, o in ((a, opt), (b, ref)):
            o.zero_grad()
            backward(m, step)
        average_grads_by_hand(b, "sum" if summing else "average")
        opt.step()
        ref.step()
    np.testing.assert_allclose(flat(a), flat(b), rtol=1e-10, atol=1e-12)
    assert opt.averager.op == ("sum" if summing else "average")
    opt.close()


def test_unsupported_ops_and_factors_are_refused():
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    for op, match in [("adasum", "Adasum is not supported"),
                      (pc.MAX, "op must be 'average' or 'sum'"),
                      (MPI.PROD, "op must be"), ("mean", "op must be"),
                      (3, "op must be")]:
        with pytest.raises(pc.ScheduleError, match=match):
            pct.EagerOptimizer(inner, named, mode="sync", op=op)
    for f in (0, -2.0, float("nan"), float("inf"), True, "2"):
        with pytest.raises(pc.ScheduleError, match="finite number > 0"):
            pct.EagerOptimizer(inner, named, gradient_predivide_factor=f)
    with pytest.raises(pc.ScheduleError, match="needs op='average'"):
        pct.EagerOptimizer(inner, named, op="sum",
                           gradient_predivide_factor=2.0)
    for n in (0, 1.5, True, None):
        with pytest.raises(pc.ScheduleError, match="backward_passes_per"):
            pct.EagerOptimizer(inner, named, backward_passes_per_step=n)
    COMM.Barrier()


def test_options_that_differ_between_ranks_fail_everywhere():
    if P == 1:
        pytest.skip("needs two ranks to differ")
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    for kw, key in [({"op": "sum" if RANK else "average"}, "op"),
                    ({"gradient_predivide_factor": 1.0 + RANK},
                     "gradient_predivide_factor"),
                    ({"backward_passes_per_step": 1 + RANK},
                     "backward_passes_per_step")]:
        with pytest.raises(pc.ScheduleError, match=f"{key}: rank 0="):
            pct.EagerOptimizer(inner, named, mode="sync", **kw)
    COMM.Barrier()


@pytest.mark.parametrize("mode", ["sync", "solo"])
def test_gradient_predivide_factor_keeps_the_average(mode):
    """Divided by f before the sum and by P/f after: sync mode equals the
    plain average; in solo mode every update over the run sums to
    -lr * (sum of every rank's gradients) / P, as without f."""
    f = P + 0.5
    a, b = make_model(), make_model()
    opt = pct.EagerOptimizer(torch.optim.SGD(a.parameters(), lr=0.05),
                             a.named_parameters(), mode=mode,
                             gradient_predivide_factor=f)
    ref = torch.optim.SGD(b.parameters(), lr=0.05)
    w0 = flat(a)
    gsum = np.zeros_like(w0)
    for step in range(6):
        for m, o in ((a, opt), (b, ref)):
            o.zero_grad()
            backward(m, step)
        gsum += torch.cat([p.grad.reshape(-1) for p in a.parameters()]
                          ).numpy()
        opt.step()
        if mode == "sync":
            average_grads_by_hand(b)
            ref.step()
    opt.flush()
    if mode == "sync":
        np.testing.assert_allclose(flat(a), flat(b), rtol=1e-10, atol=1e-12)
    COMM.Allreduce(MPI.IN_PLACE, gsum)
    np.testing.assert_allclose(w0 - flat(a), 0.05 * gsum / P, rtol=1e-9,
                               atol=1e-11)
    assert_replicas_equal(a)
    opt.close()


# -- backward_passes_per_step -------------------------------------------------
N = 3


@pytest.mark.parametrize("loop", ["step-every-pass", "zeroed-in-place",
                                  "horovod"])
def test_backward_passes_per_step_equals_accumulating_by_hand(loop):
    """Sync mode, N = 3, momentum: a plain optimizer fed the average of the
    gradients summed over each 3 passes by hand.  ``step-every-pass``:
    zero_grad() and step() around every pass, the parameters move on every
    3rd only (``zeroed-in-place``: zero_grad(set_to_none=False));
    ``horovod``: 3 backward passes, then one step()."""
    a, b = make_model(), make_model()
    opt = pct.EagerOptimizer(momentum(a.parameters()), a.named_parameters(),
                             mode="sync", backward_passes_per_step=N)
    ref = momentum(b.parameters())
    for block in range(3):
        ref.zero_grad()
        for k in range(N):
            backward(b, N * block + k)
        average_grads_by_hand(b)
        ref.step()
        for k in range(N):
            before = flat(a)
            if loop != "horovod":
                opt.zero_grad(set_to_none=loop == "step-every-pass")
            backward(a, N * block + k)
            if loop != "horovod":
                opt.step()
                moved = not np.array_equal(before, flat(a))
                assert moved == (k == N - 1), (block, k)
        if loop == "horovod":
            opt.step()
            opt.zero_grad()
        np.testing.assert_allclose(flat(a), flat(b), rtol=1e-10, atol=1e-12)
    assert opt.stats()["steps"] == 3        # one reduction per 3 passes
    assert_replicas_equal(a)
    opt.close()


def test_more_passes_than_announced_is_an_error_and_synchronize_takes_all():
    a, b = make_model(), make_model()
    opt = pct.EagerOptimizer(torch.optim.SGD(a.parameters(), lr=0.1),
                             a.named_parameters(), mode="sync",
                             backward_passes_per_step=2)
    for step in range(3):
        backward(a, step)
    with pytest.raises(pc.ScheduleError, match="3 backward passes before "
                       "step\\(\\), more than backward_passes_per_step=2"):
        opt.step()
    opt.zero_grad()
    # one pass stepped (kept locally), a second not yet: synchronize()
    # reduces both, as a plain optimizer fed their average by hand
    ref = torch.optim.SGD(b.parameters(), lr=0.1)
    backward(a, 10)
    opt.step()
    opt.zero_grad()
    backward(a, 11)
    backward(b, 10)
    backward(b, 11)
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    average_grads_by_hand(b)
    ref.step()
    np.testing.assert_allclose(flat(a), flat(b), rtol=1e-10, atol=1e-12)
    opt.close()


def test_backward_passes_per_step_under_solo_loses_nothing():
    """Solo mode, N = 2, plain SGD: after flush the updates sum to
    -lr * (every gradient of every pass, every rank) / P on every rank."""
    model = make_model()
    opt = pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                             model.named_parameters(), mode="solo",
                             backward_passes_per_step=2)
    w0, gsum = flat(model), np.zeros(flat(model).shape)
    for step in range(10):
        opt.zero_grad()
        backward(model, step)
        gsum += torch.cat([p.grad.reshape(-1) for p in model.parameters()]
                          ).numpy()
        opt.step()
    opt.flush()
    COMM.Allreduce(MPI.IN_PLACE, gsum)
    np.testing.assert_allclose(w0 - flat(model), 0.05 * gsum / P,
                               rtol=1e-9, atol=1e-11)
    assert opt.stats()["steps"] == 5
    opt.close()


# -- gradients edited between backward and step() (overlap) -----------------
def _edit(model, how):
    if how == "clip":
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    elif how == "in_place":
        model[0].weight.grad.mul_(0.5)
    else:                                   # a new tensor in .grad
        model[0].weight.grad = model[0].weight.grad * 0.5


@pytest.mark.parametrize("how", ["clip", "in_place", "replaced"])
@pytest.mark.parametrize("mode", ["sync", "solo"])
def test_a_gradient_edited_after_overlap_handed_it_over_is_refused(mode,
                                                                   how):
    """With overlap the reduction holds the gradients as backward made
    them; editing them before step() (clipping, unscaling) would be lost.
    step() refuses on every rank, applies nothing, and the optimizer goes
    on working (Horovod's pattern: synchronize(), edit, step())."""
    a = make_model()
    opt = pct.EagerOptimizer(torch.optim.SGD(a.parameters(), lr=0.1),
                             a.named_parameters(), mode=mode, overlap=True)
    assert opt.overlap
    w0 = flat(a)
    opt.zero_grad()
    backward(a, 0)
    _edit(a, how)
    with pytest.raises(pc.ScheduleError, match="changed after backward"):
        opt.step()
    np.testing.assert_array_equal(flat(a), w0)
    opt.zero_grad()
    backward(a, 1)
    opt.synchronize()
    _edit(a, how)
    with opt.skip_synchronize():
        opt.step()
    opt.flush()
    assert not np.array_equal(flat(a), w0)
    if mode == "sync":          # solo: ranks edit different partial sums
        assert_replicas_equal(a)
    opt.close()


def test_an_edit_before_the_last_accumulated_pass_is_kept():
    """backward_passes_per_step=2 with a step() after each pass: the first
    pass's gradient is not handed over yet, so clipping it is fine and the
    result equals overlap=False's, bit for bit."""
    a, b = make_model(), make_model()
    opts = [pct.EagerOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                               m.named_parameters(), mode="sync",
                               overlap=ov, backward_passes_per_step=2)
            for m, ov in ((a, True), (b, False))]
    assert opts[0].overlap and not opts[1].overlap
    for step in range(3):
        for m, o in zip((a, b), opts):
            o.zero_grad()
            backward(m, 2 * step)
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.01)
            o.step()
            backward(m, 2 * step + 1)
            o.step()
    np.testing.assert_array_equal(flat(a), flat(b))
    for o in opts:
        o.close()


def test_grad_scaler_with_overlap_through_synchronize():
    """GradScaler with overlap, the documented way (synchronize(), then
    unscale_, then step inside skip_synchronize()): the update equals
    overlap=False's, where each rank unscales before averaging.  (Its
    unscale_ does not bump torch's version counter, so step() cannot see
    it: see the docs' overlap page.)"""
    a, b = make_model().float(), make_model().float()
    opts = [pct.EagerOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                               m.named_parameters(), mode="sync",
                               overlap=ov) for m, ov in ((a, True), (b, False))]
    scalers = [torch.amp.GradScaler("cpu", init_scale=1024.0)
               for _ in opts]
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(RANK))
    w0 = flat(a)
    for m, o, s in zip((a, b), opts, scalers):
        o.zero_grad()
        s.scale(m(x).pow(2).mean()).backward()
        if o.overlap:
            o.synchronize()
            s.unscale_(o)
            with o.skip_synchronize():
                s.step(o)
        else:
            s.step(o)
        s.update()
    np.testing.assert_allclose(flat(a), flat(b), rtol=1e-6, atol=1e-7)
    assert not np.array_equal(flat(a), w0)
    for o in opts:
        o.close()


# -- the wrapped optimizer's state, replaced after wrapping -----------------
def test_broadcast_or_load_into_the_inner_optimizer_after_wrapping():
    """broadcast_optimizer_state(inner) and inner.load_state_dict() replace
    the inner optimizer's param_groups and state: the wrapper (and an LR
    scheduler made on it) sees the new ones on every rank."""
    a = make_model()
    inner = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    opt = pct.EagerOptimizer(inner, a.named_parameters(), mode="sync")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    if RANK == 0:
        inner.param_groups[0]["lr"] = 0.4
    pct.broadcast_optimizer_state(inner, root_rank=0)
    assert opt.param_groups is inner.param_groups
    assert opt.state is inner.state
    assert opt.param_groups[0]["lr"] == 0.4
    opt.zero_grad()
    backward(a, 0)
    opt.step()
    sched.step()
    assert inner.param_groups[0]["lr"] == pytest.approx(0.2)
    assert len(opt.state_dict()["state"]) == len(list(a.parameters()))
    saved = opt.state_dict()
    fresh = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    inner.load_state_dict(fresh.state_dict())       # the inner one
    assert opt.param_groups[0]["lr"] == 0.1 and not opt.state
    opt.load_state_dict(saved)                      # the wrapper's
    assert inner.param_groups[0]["lr"] == pytest.approx(0.2)
    assert len(inner.state) == len(list(a.parameters()))
    opt.close()
