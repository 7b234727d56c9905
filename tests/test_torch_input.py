"""What partialcoll.torch refuses, and how: a bad argument on one rank
raises on every rank (never a hang), options are refused rather than
truncated, and tensors torch marks lazily negated are read with their
sign.  At the running comm size."""
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
LAST = P - 1                # the rank that gets the bad argument
torch.set_num_threads(1)


def make(model=None, **kw):
    model = model if model is not None else torch.nn.Linear(3, 2)
    return pct.EagerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                              model.named_parameters(), **kw)


def one_rank(bad, good):
    return bad if RANK == LAST else good


# -- a bad argument on one rank: the same error on every rank ---------------
def _frozen():
    return torch.nn.Linear(3, 2).requires_grad_(False)


SETUPS = {
    "no_trainable_parameter": (
        lambda: make(one_rank(_frozen(), torch.nn.Linear(3, 2))),
        "no parameter that requires a gradient"),
    "bfloat16_model": (
        lambda: make(torch.nn.Linear(3, 2).to(
            one_rank(torch.bfloat16, torch.float32))),
        "bfloat16"),
    "bogus_mode": (lambda: make(mode=one_rank("bogus", "sync")),
                   "mode must be"),
    "negative_bucket_bytes": (lambda: make(bucket_bytes=one_rank(-1, None)),
                              "bucket_bytes must be a positive integer"),
    "missing_named_parameters": (
        lambda: (lambda m: pct.EagerOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.1),
            one_rank(list(m.named_parameters())[:1],
                     m.named_parameters())))(torch.nn.Linear(3, 2)),
        "does not name"),
    "bad_passes": (lambda: make(backward_passes_per_step=one_rank(0, 1)),
                   "backward_passes_per_step"),
    "bad_priorities": (lambda: make(priorities=one_rank({"weight": "x"},
                                                        None)),
                       "priorities"),
}


@pytest.mark.parametrize("case", sorted(SETUPS))
def test_a_bad_argument_on_one_rank_raises_on_every_rank(case):
    """Each rank checks its own arguments first; the problem travels in the
    agreement every rank joins, so none is left waiting."""
    build, words = SETUPS[case]
    with pytest.raises(pc.ScheduleError, match=words) as err:
        build()
    if P > 1:
        assert f"rank {LAST}" in str(err.value)
    ok = make()                         # nothing left half-agreed
    ok.close()


def test_a_bad_argument_on_one_rank_of_the_numpy_averager():
    with pytest.raises(pc.ScheduleError, match="sync_every"):
        pc.eager.EagerAverager([np.zeros(3)], mode="sync",
                               sync_every=one_rank(2.5, None))
    with pytest.raises(pc.ScheduleError, match="seed"):
        pc.eager.EagerAverager([np.zeros(3)], mode="majority",
                               seed=one_rank("x", 0))


# -- option values: refused, not truncated ----------------------------------
@pytest.mark.parametrize("kw", [
    {"sync_every": 2.5}, {"sync_every": "x"}, {"sync_every": float("inf")},
    {"sync_every": "3"}, {"sync_every": True}, {"sync_every": 0},
    {"bucket_bytes": True}, {"bucket_bytes": 1.5}, {"bucket_bytes": "abc"},
    {"mode": "solo", "partition_bytes": 0.5},
    {"mode": "majority", "seed": 1.5}, {"mode": "majority", "seed": None},
    {"mode": "majority", "seed": "x"},
    {"priorities": {"weight": float("nan")}},
    {"priorities": {"weight": "high"}}, {"priorities": {"weight": 1.5}},
], ids=repr)
def test_bad_option_values_are_refused_with_their_name(kw):
    name = [k for k in kw if k != "mode"][0]
    with pytest.raises(pc.ScheduleError, match=name):
        make(**kw)


def test_good_option_values_still_work():
    o = make(sync_every=np.int64(2), bucket_bytes=64, mode="sync")
    assert o.averager.sync_every == 2
    o.close()
    o = make(mode="majority", seed=np.int64(3))
    o.close()


def test_sparse_gradients_get_a_clear_refusal():
    emb = torch.nn.Embedding(5, 2, sparse=True)
    for overlap in (False, True):
        opt = make(emb, mode="sync", overlap=overlap)
        opt.zero_grad()
        with pytest.raises(pc.ScheduleError, match="dense gradients only"):
            emb(torch.tensor([1, 2])).sum().backward()
            opt.step()
        opt.close()


# -- pct.allreduce ----------------------------------------------------------
def test_a_negated_view_is_summed_with_its_sign():
    """torch.tensor(1+2j).conj().imag is -2 through torch's negative bit,
    which DLPack cannot carry: pct.allreduce resolves it, pc.allreduce
    refuses it (its in-place forms could not write back)."""
    t = torch.tensor(1 + 2j).conj().imag
    assert t.is_neg() and t.item() == -2.0
    assert pct.allreduce(t, op="sum").item() == -2.0 * P
    assert pct.allreduce(t).item() == -2.0
    z = torch.tensor([1 + 2j, 3 - 1j]).conj()
    np.testing.assert_allclose(pct.allreduce(z, op="sum").numpy(),
                               P * np.array([1 - 2j, 3 + 1j]))
    with pytest.raises(pc.ScheduleError, match="resolve_neg"):
        pc.allreduce(t)
    assert pc.allreduce(t.resolve_neg()).item() == -2.0 * P


def test_allreduce_misuse_is_clear():
    with pytest.raises(pc.ScheduleError, match="torch tensor"):
        pct.allreduce(np.ones(3))
    with pytest.raises(pc.ScheduleError, match="comm must be"):
        pct.allreduce(torch.ones(3), comm="x")


# -- synchronize_model ------------------------------------------------------
@pytest.mark.parametrize("form", ["parameters", "list"])
def test_synchronize_model_refuses_bare_tensors(form):
    """model.parameters() would be unpacked as (name, tensor) pairs of
    rows: refused on every rank, nothing changed."""
    torch.manual_seed(RANK)
    m = torch.nn.Linear(2, 2)
    before = [p.detach().clone() for p in m.parameters()]
    arg = m.parameters() if form == "parameters" else list(m.parameters())
    with pytest.raises(pc.ScheduleError, match="pass the model"):
        pct.synchronize_model(arg)
    for p, b in zip(m.parameters(), before):
        assert torch.equal(p.detach(), b)
