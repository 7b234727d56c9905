"""partialcoll.core.schemas: JSON Schema checks that take what Python
programs pass (NumPy numbers, tuples) and raise partialcoll's errors with
the setting named."""
import math

import numpy as np
import pytest

from partialcoll import ArgumentTypeError, ScheduleError
from partialcoll.core.schemas import check

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 1, "says": "an integer >= 1"},
        "x": {"type": "number", "real": "finite", "says": "finite"},
        "y": {"type": "number", "real": "not-nan", "says": "a number"},
        "pair": {"type": "array", "minItems": 2, "maxItems": 2,
                 "says": "a pair", "prefixItems": [
                     {"type": "number", "minimum": 0, "says": ">= 0"}]},
        "mode": {"enum": ["a", "b"], "says": "'a' or 'b'"},
    },
    "allOf": [{"if": {"properties": {"mode": {"const": "b"}},
                      "required": ["mode"]},
               "then": {"properties": {"n": {
                   "minimum": 2, "message": "mode {mode!r} needs "
                                            "{n_name} >= 2"}}}}],
}


def test_what_python_passes_is_accepted():
    check(SCHEMA, {"n": np.int64(3), "x": np.float32(1.5), "y": math.inf,
                   "pair": (1.0, "anything"), "mode": "b"})


@pytest.mark.parametrize("values,kind,message", [
    ({"n": 0}, ScheduleError, "n must be an integer >= 1, got 0"),
    ({"n": 2.0}, ArgumentTypeError, "n must be an integer >= 1, got 2.0"),
    ({"n": True}, ArgumentTypeError, "got True"),
    ({"x": math.inf}, ScheduleError, "x must be finite, got inf"),
    ({"x": math.nan}, ScheduleError, "x must be finite, got nan"),
    ({"y": math.nan}, ScheduleError, "y must be a number, got nan"),
    ({"pair": (1,)}, ScheduleError, "pair must be a pair, got (1,)"),
    ({"pair": (-1, 0)}, ScheduleError, "the first must be >= 0, got -1"),
    ({"pair": 3}, ArgumentTypeError, "pair must be a pair, got 3"),
    ({"mode": "c"}, ScheduleError, "mode must be 'a' or 'b', got 'c'"),
    ({"mode": "b", "n": 1}, ScheduleError, "mode 'b' needs count >= 2"),
])
def test_problems_name_the_setting(values, kind, message):
    names = {("pair", 0): "the first", "n": "count"} if "mode" in values \
        and "n" in values else {("pair", 0): "the first"}
    with pytest.raises(kind) as info:
        check(SCHEMA, values, names)
    assert type(info.value) is kind
    assert message in str(info.value)
