"""partialcoll.torch.synchronize_model at the running comm size: 16-bit
floats are averaged (not refused), and a bad state raises on every rank
instead of leaving the others waiting."""
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16,
                                   torch.float32])
def test_floats_of_every_width_are_averaged(dtype):
    """Each rank holds rank-dependent values; afterwards every rank holds
    the float32 average of them, rounded once to the tensor's dtype; an
    integer buffer takes rank 0's value."""
    model = torch.nn.Linear(3, 2).to(dtype)
    model.register_buffer("steps", torch.tensor([7 + RANK]))
    # quarters: exact in every dtype here and in any sum of them, so the
    # sum's order (MPI's against torch's) cannot change a bit
    values = [torch.arange(6, dtype=torch.float32).reshape(2, 3) * (r + 1)
              + 0.25 * r for r in range(P)]
    with torch.no_grad():
        model.weight.copy_(values[RANK].to(dtype))
        model.bias.fill_(0.5 + RANK)
    want = (torch.stack([v.to(dtype).float() for v in values]).sum(0)
            / P).to(dtype)
    pct.synchronize_model(model)
    assert model.weight.dtype == dtype
    assert torch.equal(model.weight.detach(), want)
    bias = sum(torch.tensor(0.5 + r).to(dtype).float() for r in range(P)) / P
    assert torch.equal(model.bias.detach(),
                       torch.full((2,), float(bias)).to(dtype))
    assert model.steps.tolist() == [7]


def test_a_bad_state_on_one_rank_raises_on_every_rank():
    """Rank P-1 passes a state with a non-tensor entry: every rank raises
    (naming that rank), none waits; then the same call with good states
    works."""
    good = {"w": torch.full((4,), float(RANK))}
    state = dict(good)
    if RANK == P - 1:
        state["oops"] = 3.0
    where = "this rank" if RANK == P - 1 else f"rank {P - 1}"
    with pytest.raises(pc.ScheduleError, match=f"on {where}, oops is not"):
        pct.synchronize_model(state)
    pct.synchronize_model(good)
    np.testing.assert_allclose(good["w"].numpy(), (P - 1) / 2)


@pytest.mark.skipif(P < 2, reason="needs two ranks to differ")
def test_shapes_that_differ_raise_on_every_rank():
    state = {"w": torch.zeros(3 if RANK == 0 else 4)}
    with pytest.raises(pc.ScheduleError, match="differ between rank"):
        pct.synchronize_model(state)
