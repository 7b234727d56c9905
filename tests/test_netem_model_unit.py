"""The emulated network's fluid model alone (csrc/pc_netem_model.c, through
``_core.netem_model``): no MPI, one process.  The model runs on absolute
CLOCK_MONOTONIC seconds, so these tests put it at the times a long-running
host has (tens of thousands of seconds), where a step of time is a
multiple of 7e-12 s."""
import math

import numpy as np
import pytest

from partialcoll import _core, network

WIRE, DONE = 1, 2


def model(cfg, msgs, t, now, P=2):
    """(model time after, [(state, left, t_end)]) for ``msgs``
    [(src, dst, level, bytes, left of the first in its channel)]."""
    text = network._text(network.normalise(cfg, P), "/unused")
    return _core.netem_model(text, 0.0, t, msgs, now)


def test_a_flow_whose_rest_is_below_the_clocks_resolution_still_ends():
    """The state of the overlap benchmark's hang (solo mode, P = 2, after
    the device benchmark), read from the shared segment of the hung run:
    channel 0 -> 1 had 0.0012 bytes of a 56-byte message left, more than
    the completion tolerance (1e-6 x bytes + 1e-3) but at 1 GB/s 1.2e-12 s
    of wire time, less than half a step of the clock at t = 39432 s
    (7.3e-12 s): t + left / rate == t.  Every pass of the model then
    chose that finish as its next event, advanced by nothing and ended
    nothing, so its time stayed there and every message on the network
    with it: both ranks waited for a round whose data never arrived.  It
    must end at once and the model must reach ``now``."""
    t = 39432.511857264864
    cfg = {"default": {"out_rate": "1 GB/s", "in_rate": "1 GB/s",
                       "latency": "0.1 ms"}}
    msgs = [(0, 1, 0, 56, 0.001215431079742757), (0, 1, 0, 32, 32),
            (0, 1, 0, 131072, 131072), (1, 0, 0, 32, 32),
            (1, 0, 0, 2052, 2052)]
    assert t + msgs[0][4] / 1e9 == t         # the condition itself
    after, states = model(cfg, msgs, t, t + 0.01)
    assert after == t + 0.01
    assert [s for s, _, _ in states] == [DONE] * len(msgs)
    assert states[0][2] == t                  # it ended where it stood
    # the rest followed at the link's rate, in channel order
    ends = [e for _, _, e in states]
    assert ends[0] < ends[1] < ends[2] and ends[3] < ends[4]
    assert ends[2] == pytest.approx(t + (32 + 131072) / 1e9, abs=1e-9)


@pytest.mark.parametrize("t", [1.0, 4e4, 3.3e5, 4e6])
@pytest.mark.parametrize("rate", [1e6, 3e8, 1e10])
def test_the_model_always_reaches_now_at_any_clock_and_rate(t, rate):
    """Whatever rounding leaves in a flow (here: a remainder just above
    the tolerance, or a large message), the model reaches ``now`` and ends
    every message the rate lets through, at its computed time."""
    cfg = {"default": {"out_rate": rate, "in_rate": rate}}
    rng = np.random.default_rng(int(t) ^ int(rate))
    msgs = [(0, 1, 0, 56, 0.00106 + 1e-4 * rng.random()), (0, 1, 0, 4096,
            4096), (1, 0, 0, 1000, 1000), (1, 2, 1, 64, 64),
            (2, 1, 0, 64, 1e-9)]
    total = 56 + 4096 + 1000 + 64 + 64
    now = t + 10 * total / rate + 1e-6
    after, states = model(cfg, msgs, t, now, P=3)
    assert after == now
    assert all(s == DONE for s, _, _ in states), states
    assert all(t <= e <= now for _, _, e in states)


def test_a_step_short_of_a_flows_end_leaves_it_on_the_wire():
    """The other side: the model stops at ``now`` and a message whose end
    lies beyond it stays on the wire with the right bytes left."""
    t = 39432.5
    cfg = {"default": {"out_rate": "1 MB/s", "in_rate": "1 MB/s"}}
    after, states = model(cfg, [(0, 1, 0, 1000, 1000)], t, t + 5e-4)
    assert after == t + 5e-4
    state, left, _ = states[0]
    assert state == WIRE and math.isclose(left, 500, rel_tol=1e-6)
