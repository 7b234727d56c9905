"""The emulated network's description is checked against a JSON Schema
(partialcoll.transport.network_schema) before its values: unknown keys,
wrong types and values out of their set are refused with the place named
as in the TOML; what depends on the job (ranks) or a unit is checked
after."""
import pytest

from partialcoll import ArgumentTypeError, ScheduleError
from partialcoll.transport import network
from partialcoll.transport.network_schema import SCHEMA, where

FULL = {
    "seed": 3, "drop_mode": "silent", "tick": "1 ms",
    "message_overhead": "10 us",
    "default": {"out_rate": "10 MB/s", "in_rate": 1e7, "latency": "1 ms",
                "drop": 0.01},
    "rank": {"1": {"out_rate": "1 MB/s"}},
    "class": {"3": {"drop": 0.5, "priority": "low"}},
    "priority": {"weight": "strict", "low_buffer": "64K"},
    "pair": [{"src": 0, "dst": 1, "latency": "2 ms", "drop": 0.1,
              "class": 3}],
    "trace": [{"ranks": [0, 1], "nic": "out", "every": "0.5 s",
               "factors": [0.5, 1.0], "probabilities": [0.25, 0.75]},
              {"rates": ["1 MB/s", "2 MB/s"]}],
}


def test_a_full_description_passes():
    n = network.normalise(FULL, 2)
    assert n["low_buffer"] == 65536 and n["weight"] == 1e6
    assert n["levels"] == {3: 1} and n["classes"] == {3: 0.5}
    assert n["traces"][0]["values"] == [0.5, 1.0]


@pytest.mark.parametrize("cfg,match", [
    ({"sead": 1}, r"network: unknown key\(s\).*'sead'"),
    ({"default": {"rate": "1 MB/s"}}, r"\[default\]: unknown key"),
    ({"rank": {"0": {"latency": "1 ms"}}}, r"\[rank.0\]: unknown key"),
    ({"pair": [{"src": 0, "dst": 1, "loss": 0.1}]},
     r"\[\[pair\]\] #1: unknown key"),
    ({"drop_mode": "loud"}, r"drop_mode: 'loud' is not one of"),
    ({"class": {"1": {"priority": "medium"}}},
     r"\[class.1\] priority: 'medium' is not one of"),
    ({"default": {"drop": 1.5}}, r"\[default\] drop: 1.5 is greater than"),
    ({"pair": [{"src": 0}]}, r"\[\[pair\]\] #1: 'dst' is a required"),
    ({"pair": [{"src": 0, "dst": 1, "class": 16}]},
     r"\[\[pair\]\] #1 class: 16 is greater than"),
    ({"trace": [{"rates": [1e6], "factors": [1.0]}]},
     r"\[\[trace\]\] #1: give either rates or factors"),
    ({"trace": [{"factors": [-1.0, 1.0]}]},
     r"\[\[trace\]\] #1 factors 0: -1.0 is less than"),
    ({"priority": {"weight": 0.5}}, r"\[priority\] weight"),
    ({"seed": -2}, r"seed: -2 is less than"),
])
def test_bad_shapes_name_the_place(cfg, match):
    with pytest.raises(ScheduleError, match=match):
        network.normalise(cfg, 2)


@pytest.mark.parametrize("cfg", [{"seed": "one"}, {"default": []},
                                 {"pair": {"src": 0}},
                                 {"trace": [{"factors": ["x"]}]}])
def test_wrong_types_are_type_errors(cfg):
    with pytest.raises(ArgumentTypeError, match="network description"):
        network.normalise(cfg, 2)


def test_what_the_schema_leaves_to_the_code():
    """Ranks depend on the job, values on their units."""
    with pytest.raises(ScheduleError, match="not a rank"):
        network.normalise({"rank": {"5": {"out_rate": 1e6}}}, 2)
    with pytest.raises(ScheduleError, match=r"\[\[pair\]\] #1: rank 2"):
        network.normalise({"pair": [{"src": 0, "dst": 2}]}, 2)
    with pytest.raises(ScheduleError, match="cannot read"):
        network.normalise({"default": {"out_rate": "fast"}}, 2)


def test_the_schema_is_the_one_the_docs_show():
    assert set(SCHEMA["properties"]) == {
        "seed", "drop_mode", "tick", "message_overhead", "default", "rank",
        "class", "priority", "pair", "trace"}
    assert where(["pair", 1, "drop"]) == "[[pair]] #2 drop"
    assert where(["rank", "3", "out_rate"]) == "[rank.3] out_rate"
    assert where(["seed"]) == "seed"
