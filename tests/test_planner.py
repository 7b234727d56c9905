"""TicTac's planner (partialcoll.tictac.planner) on hand-made graphs:
the paper's own examples (Figures 1a, 5a, 5b), Equation 2 against a
replay, TIC's ties, TAC's order, renumbering for the counter gate.  No
MPI."""
import itertools
import math
import random
import time

import pytest

from partialcoll.tictac import planner
from partialcoll.tictac.planner import Graph


def figure_1a(t_recv=1.0, t_op=2.0):
    g = Graph()
    r1, r2 = g.recv("recv1", t_recv), g.recv("recv2", t_recv)
    op1 = g.compute("op1", t_op, [r1])
    g.compute("op2", t_op, [op1, r2])
    return g


def case_1(MA, PA, MB, PB, b_first=False):
    """Figure 5a: two receives, each unlocking its own op."""
    g = Graph()
    names = ["B", "A"] if b_first else ["A", "B"]
    times = {"A": (MA, PA), "B": (MB, PB)}
    for n in names:
        r = g.recv(n, times[n][0])
        g.compute("op" + n, times[n][1], [r])
    return g


def figure_5b(t=1.0):
    g = Graph()
    a, b, c, d = (g.recv(n, t) for n in "ABCD")
    op1 = g.compute("op1", 1.0, [a, b])
    op2 = g.compute("op2", 1.0, [op1, c])
    g.compute("op3", 1.0, [op2, d])
    return g


def test_properties_of_figure_1a():
    """Section 4.1's worked example: recv1.P = Time(op1), recv2.P = 0,
    M+ of both = Time(recv1) + Time(recv2)."""
    props = planner.properties(figure_1a(1.0, 2.0))
    assert props["recv1"] == (1.0, 2.0, 2.0)     # (M, P, M+)
    assert props["recv2"] == (1.0, 0.0, 2.0)


def test_tic_ties_and_tac_breaks_them_on_figure_1a():
    g = figure_1a()
    assert planner.tic(g) == {"recv1": 2, "recv2": 2}     # ties share
    assert planner.tac(g) == {"recv1": 0, "recv2": 1}     # P breaks it


@pytest.mark.parametrize("b_first", [False, True])
def test_case_1_puts_A_first(b_first):
    """The paper's case: M_A = 1, P_A = 10, M_B = 10, P_B = 1 must put A
    first (min(P_B, M_A) = 1 < min(P_A, M_B) = 10), whatever the order
    the receives appear in."""
    g = case_1(1, 10, 10, 1, b_first)
    assert planner.tac(g) == {"A": 0, "B": 1}
    a, b = planner.properties(g)["A"], planner.properties(g)["B"]
    assert a == (1, 10, math.inf) and b == (10, 1, math.inf)
    assert planner.comparator(a, b) and not planner.comparator(b, a)


def test_equation_2_picks_the_shorter_makespan():
    """Equation 2 is derived from T(A->B) = M_A + max(P_A, M_B) + P_B;
    whenever the two orders differ in makespan (list-scheduling replay),
    the comparator picks the shorter one."""
    rng = random.Random(7)
    checked = 0
    for _ in range(500):
        MA, PA, MB, PB = (rng.randint(0, 12) for _ in range(4))
        g = case_1(MA, PA, MB, PB)
        t_ab = planner.simulate(g, {"A": 0, "B": 1}, stream=False)[0]
        t_ba = planner.simulate(g, {"B": 0, "A": 1}, stream=False)[0]
        assert t_ab == MA + max(PA, MB) + PB
        if t_ab == t_ba:
            continue
        props = planner.properties(g)
        assert planner.comparator(props["A"], props["B"]) == (t_ab < t_ba), \
            (MA, PA, MB, PB)
        checked += 1
    assert checked > 300


def test_case_2_figure_5b_breaks_ties_by_M_plus():
    """All P are 0 (no op waits on one receive alone); M+ orders them:
    A.M+ = B.M+ = 2 < C.M+ = 3 < D.M+ = 4."""
    g = figure_5b()
    props = planner.properties(g)
    assert [props[n][1] for n in "ABCD"] == [0, 0, 0, 0]
    assert [props[n][2] for n in "ABCD"] == [2, 2, 3, 4]
    assert planner.tic(g) == {"A": 2, "B": 2, "C": 3, "D": 4}
    assert planner.tac(g) == {"A": 0, "B": 1, "C": 2, "D": 3}


def test_properties_follow_the_outstanding_set():
    """Once A and B arrived (not in R), op2 waits on C alone: C.P = 1;
    D.M+ is M of op3 = Time(D) + Time(C) (only outstanding receives)."""
    props = planner.properties(figure_5b(2.0), outstanding=["C", "D"])
    assert set(props) == {"C", "D"}
    assert props["C"] == (2.0, 1.0, 4.0)
    assert props["D"] == (2.0, 0.0, 4.0)


def test_a_receive_no_op_joins_gets_inf_and_goes_last_in_tic():
    g = Graph()
    a, b, c = g.recv("a"), g.recv("b"), g.recv("c")
    g.compute("ab", 1.0, [a, b])
    g.compute("c_only", 5.0, [c])
    assert planner.properties(g)["c"][2] == math.inf
    assert planner.tic(g) == {"a": 2, "b": 2, "c": 4}
    # TAC: c unlocks 5 s of compute alone: min(P_a=0, M_c) = 0 <
    # min(P_c=5, M_a=1) = 1, so c goes first
    assert planner.tac(g)["c"] == 0


def test_enforcement_renumbers_into_a_permutation():
    tic = {"a": 2, "b": 2, "c": 4, "d": 3}
    assert planner.enforcement(tic) == {"a": 0, "b": 1, "d": 2, "c": 3}
    draws = {tuple(sorted(planner.enforcement(tic, "random", s).items()))
             for s in range(20)}
    for d in draws:
        d = dict(d)
        assert sorted(d.values()) == [0, 1, 2, 3]
        assert d["d"] == 2 and d["c"] == 3 and {d["a"], d["b"]} == {0, 1}
    assert len(draws) == 2                       # both tie orders occur
    assert planner.enforcement(tic, "random", 5) == \
        planner.enforcement(tic, "random", 5)    # seeded
    with pytest.raises(ValueError, match="tie_break"):
        planner.enforcement(tic, "alphabetical")


def random_graph(rng, n_recv=12, n_ops=40, stream=False):
    """A layered random DAG: each compute op reads 1-2 earlier compute ops
    and, with probability 1/2, one receive."""
    g = Graph()
    recvs = [g.recv(f"r{k}", rng.uniform(0.5, 3.0)) for k in range(n_recv)]
    unused = list(recvs)
    rng.shuffle(unused)
    ops = []
    for k in range(n_ops):
        deps = rng.sample(ops, min(len(ops), rng.randint(1, 2))) if ops else []
        if unused and (rng.random() < 0.5 or not ops):
            deps.append(unused.pop())
        elif rng.random() < 0.2:
            deps.append(rng.choice(recvs))
        if stream and ops:
            deps.append(ops[-1])
        ops.append(g.compute(f"c{k}", rng.uniform(0.1, 2.0), deps))
    for r in unused:
        ops.append(g.compute(f"late{r}", 0.5, [ops[-1], r]))
    return g


def test_tic_and_tac_beat_random_orders_on_random_graphs():
    """On random DAGs, TAC's and TIC's orders replay (list scheduling)
    no slower than the median random order, and TAC on average at least
    as well as TIC."""
    rng = random.Random(3)
    tac_total = tic_total = 0.0
    for trial in range(15):
        g = random_graph(rng)
        names = [r.name for r in g.recvs]
        rand = []
        for _ in range(30):
            perm = names[:]
            rng.shuffle(perm)
            rand.append(planner.simulate(g, {n: k for k, n in
                                             enumerate(perm)}, False)[0])
        t_tac = planner.simulate(g, planner.tac(g), False)[0]
        t_tic = planner.simulate(g, planner.enforcement(planner.tic(g)),
                                 False)[0]
        median = sorted(rand)[len(rand) // 2]
        assert t_tac <= median + 1e-9, trial
        assert t_tic <= median + 1e-9, trial
        tac_total += t_tac
        tic_total += t_tic
    assert tac_total <= tic_total * 1.02


def test_tac_is_optimal_on_small_chains():
    """A sequential program (each op after the previous one): TAC's order
    replays as fast as the best of all orders."""
    rng = random.Random(11)
    for _ in range(10):
        g = random_graph(rng, n_recv=5, n_ops=8, stream=True)
        best = min(planner.simulate(g, dict(zip(p, range(len(p)))))[0]
                   for p in itertools.permutations(r.name for r in g.recvs))
        assert planner.simulate(g, planner.tac(g))[0] == \
            pytest.approx(best)


def test_first_use_is_the_order_a_stream_needs():
    g = Graph()
    a, _, c = g.recv("a"), g.recv("b"), g.recv("c")
    x = g.compute("x", 1.0, [c])
    y = g.compute("y", 1.0, [x, a])
    g.compute("z", 1.0, [y])
    assert planner.first_use(g) == {"c": 0, "a": 1, "b": 2}


def test_simulate_counts_N_C_and_T():
    g = figure_1a(1.0, 2.0)
    assert planner.simulate(g, {"recv1": 0, "recv2": 1}) == (5.0, 2.0, 4.0)
    assert planner.simulate(g, {"recv2": 0, "recv1": 1}) == (6.0, 2.0, 4.0)


@pytest.mark.parametrize("order, error, match", [
    ({"recv1": 0}, ValueError, "leaves out"),                # incomplete
    ({"recv1": 0, "recv2": 1, "op1": 2}, ValueError, "compute op"),
    ({"recv1": 0, "recv2": 1, "recv3": 2}, ValueError, "no op named"),
    ({"recv1": 0, 0: 1}, ValueError, "twice"),
    ({"recv1": 0, "recv2": float("nan")}, ValueError, "real number"),
    (["recv1", "recv2"], TypeError, "dict")])
def test_simulate_refuses_an_order_that_is_not_the_receives(order, error,
                                                            match):
    """A missing receive counted as arrived at 0, a compute op in the
    order as a transfer: silently wrong times before."""
    with pytest.raises(error, match=match):
        planner.simulate(figure_1a(1.0, 2.0), order)


def test_simulate_takes_receive_indices():
    g = figure_1a(1.0, 2.0)
    assert planner.simulate(g, {0: 0, 1: 1}) == (5.0, 2.0, 4.0)


@pytest.mark.parametrize("deps, error", [([0.7], TypeError),
                                         ("w", TypeError),
                                         ([True], TypeError), (3, TypeError)])
def test_compute_deps_must_be_a_list_of_ops(deps, error):
    """deps=[0.7] became op 0; deps="w" a list of letters."""
    g = Graph()
    g.recv("w")
    with pytest.raises(error, match="deps|index"):
        g.compute("x", 1.0, deps)
    assert len(g.ops) == 1


def test_graph_misuse_is_refused():
    g = Graph()
    g.recv("w")
    with pytest.raises(ValueError, match="twice"):
        g.recv("w")
    with pytest.raises(ValueError, match="no op named"):
        g.compute("x", 1.0, ["nope"])
    with pytest.raises(ValueError, match="earlier ops"):
        g.compute("x", 1.0, [5])
    with pytest.raises(ValueError, match="time"):
        g.compute("y", -1.0, [0])


def test_tac_scales_to_model_sized_graphs():
    """Inception-v3 sized: ~300 receives, ~3000 ops, in a few seconds."""
    rng = random.Random(1)
    g = random_graph(rng, n_recv=300, n_ops=3000)
    t0 = time.process_time()
    order = planner.tac(g)
    assert sorted(order.values()) == list(range(300))
    assert time.process_time() - t0 < 20
