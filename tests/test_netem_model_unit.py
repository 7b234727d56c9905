"""The emulated network's fluid model alone (csrc/transport/netem_model.c,
through ``_core.netem_model``): no MPI, one process.  The model runs on absolute
CLOCK_MONOTONIC seconds, so these tests put it at the times a long-running
host has (tens of thousands of seconds), where a step of time is a
multiple of 7e-12 s."""
import math

import numpy as np
import pytest

from partialcoll import _core
from partialcoll.transport import network
from partialcoll.core.errors import ScheduleError

WIRE, DONE = 1, 2


def model_event(cfg, msgs, t, now, P=2):
    """(model time after, [(state, left, t_end)], next event) for ``msgs``
    [(src, dst, level, bytes, left of the first in its channel)]."""
    text = network._text(network.normalise(cfg, P), "/unused")
    return _core.netem_model(text, 0.0, t, msgs, now)


def model(cfg, msgs, t, now, P=2):
    """(model time after, [(state, left, t_end)])"""
    return model_event(cfg, msgs, t, now, P)[:2]


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


# The next event: a rank's poll skips the model (no lock, no advancing)
# until the next event of the whole network, unless a message joined a
# channel since (csrc/transport/netem.c, netem_poll).  The skip is exact
# only if no flow's rate changes and no flow ends before that event.

SHARED = {"default": {"out_rate": "100 MB/s", "in_rate": "100 MB/s",
                      "latency": "0"}}


def test_the_next_event_is_the_first_end_among_every_ranks_flows():
    """Ranks 1 and 2 send into rank 0 (50 MB/s each): the next event is
    rank 1's end (its 1 MB at 50 MB/s), though the probe asks for rank 0,
    which sends nothing: rank 2's flow speeds up then, so a rank may not
    sleep past another rank's end."""
    t = 1000.0
    msgs = [(1, 0, 0, 1e6, 1e6), (2, 0, 0, 2e6, 2e6)]
    after, states, event = model_event(SHARED, msgs, t, t, P=3)
    assert states[0][0] == states[1][0] == WIRE
    assert event == pytest.approx(t + 0.02, abs=1e-9)


def test_after_an_end_the_next_event_follows_the_new_rates():
    """Past rank 1's end, rank 2 alone has 1 MB left at 100 MB/s."""
    t = 1000.0
    msgs = [(1, 0, 0, 1e6, 1e6), (2, 0, 0, 2e6, 2e6)]
    after, states, event = model_event(SHARED, msgs, t, t + 0.02, P=3)
    assert states[0][0] == DONE and states[1][0] == WIRE
    assert states[1][1] == pytest.approx(1e6, rel=1e-9)
    assert event == pytest.approx(t + 0.03, abs=1e-9)


def test_a_rate_redraw_before_any_end_is_the_next_event():
    """A trace redraws the rates every 5 ms from the network's time zero:
    that boundary comes before the flow's end (10 ms), and rates may change
    there."""
    cfg = {**SHARED, "trace": [{"every": "5 ms", "factors": [1, 2]}]}
    t = 1000.001
    after, states, event = model_event(cfg, [(1, 0, 0, 1e6, 1e6)], t, t, P=2)
    assert event == pytest.approx(1000.005, abs=1e-9)


def test_no_flow_and_no_trace_no_event():
    after, states, event = model_event(SHARED, [], 5.0, 6.0, P=2)
    assert after == 6.0 and math.isinf(event)


def test_a_waiting_message_behind_a_flow_adds_no_earlier_event():
    """A channel's second message waits for the first: the first's end is
    the event (the second starts then)."""
    t = 1000.0
    msgs = [(0, 1, 0, 1e6, 1e6), (0, 1, 0, 5e5, 5e5)]
    after, states, event = model_event(SHARED, msgs, t, t, P=2)
    assert states[1][0] == 0                 # queued
    assert event == pytest.approx(t + 0.01, abs=1e-9)


@pytest.mark.parametrize("text", ["0", "0.0", " 0 ", "0 s", "0ms", 0])
def test_a_zero_time_needs_no_unit(text):
    assert network.seconds(text, "latency") == 0.0


@pytest.mark.parametrize("text", ["1", "2.5", "", "-", "."])
def test_a_time_other_than_zero_needs_its_unit(text):
    with pytest.raises(ScheduleError, match="cannot read"):
        network.seconds(text, "latency")


# ------------------------------------------------------- per-message cost
HELD = {**SHARED, "message_overhead": "2 ms"}


def test_each_message_holds_its_channel_before_its_bytes_move():
    """Three 100 kB messages back to back on one channel at 100 MB/s: each
    holds the channel 2 ms, then takes 1 ms on the wire."""
    t = 1000.0
    msgs = [(0, 1, 0, 1e5, 1e5)] * 3
    after, states = model(HELD, msgs, t, t + 0.02)
    assert [s for s, _, _ in states] == [DONE] * 3
    for k, (_, _, end) in enumerate(states):
        assert end == pytest.approx(t + 0.003 * (k + 1), abs=1e-9)
    # without the cost they are pipelined: 1, 2, 3 ms
    _, plain = model(SHARED, msgs, t, t + 0.02)
    for k, (_, _, end) in enumerate(plain):
        assert end == pytest.approx(t + 0.001 * (k + 1), abs=1e-9)


def test_a_held_message_takes_no_share_of_the_nic():
    """Rank 0 sends 100 kB then 1 MB to rank 1 and 1 MB to rank 2.  Both
    heads hold until 2 ms, then share the out-NIC (50 MB/s each): the
    100 kB ends at 4 ms.  The 1 MB behind it holds its channel from 4 to
    6 ms, when the flow to rank 2 has the whole NIC: of its 1 MB, 100 kB
    left by 4 ms and 200 kB more by 6 ms."""
    t = 1000.0
    msgs = [(0, 1, 0, 1e5, 1e5), (0, 1, 0, 1e6, 1e6), (0, 2, 0, 1e6, 1e6)]
    after, states, event = model_event(HELD, msgs, t, t + 0.006, P=3)
    assert states[0][0] == DONE
    assert states[0][2] == pytest.approx(t + 0.004, abs=1e-9)
    assert states[1][0] == WIRE and states[1][1] == pytest.approx(1e6)
    assert states[2][1] == pytest.approx(7e5, rel=1e-9)
    # now both flow at 50 MB/s: 7e5 bytes end first, 14 ms later
    assert event == pytest.approx(t + 0.006 + 0.014, abs=1e-9)


def test_the_end_of_a_hold_is_the_next_event():
    t = 1000.0
    _, states, event = model_event(HELD, [(0, 1, 0, 1e6, 1e6)], t, t)
    assert event == pytest.approx(t + 0.002, abs=1e-9)
    _, states, event = model_event(HELD, [(0, 1, 0, 1e6, 1e6)], t,
                                   t + 0.002)
    assert states[0][1] == pytest.approx(1e6)     # not a byte moved yet
    assert event == pytest.approx(t + 0.012, abs=1e-9)


@pytest.mark.parametrize("bad", ["-1 ms", "fast", "1"])
def test_a_bad_message_overhead_is_refused(bad):
    with pytest.raises(ScheduleError, match="message_overhead"):
        network.normalise({**SHARED, "message_overhead": bad}, 2)
