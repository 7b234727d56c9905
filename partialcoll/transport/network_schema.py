"""The shape of an emulated network's description (the TOML of
:mod:`.network`), as a JSON Schema: which tables and keys exist, their
types and the values a key may take.  What depends on the job (ranks in
0..P-1) or on a unit (rates, times, sizes: :mod:`partialcoll.core.units`)
is checked by :func:`.network.normalise` after it."""
import jsonschema

from ..core.errors import ArgumentTypeError, ScheduleError

_NUMBER_OR_TEXT = {"type": ["number", "string"]}
_PROBABILITY = {"type": "number", "minimum": 0, "maximum": 1}
_CLASS = {"type": "integer", "minimum": 0, "maximum": 15}
_RANK = {"type": "integer", "minimum": 0}


def _table(properties, required=()):
    return {"type": "object", "properties": properties,
            "required": list(required), "additionalProperties": False}


SCHEMA = _table({
    "seed": {"type": "integer", "minimum": 0},
    "drop_mode": {"enum": ["told", "silent"]},
    "tick": _NUMBER_OR_TEXT,
    "message_overhead": _NUMBER_OR_TEXT,
    "default": _table({"out_rate": _NUMBER_OR_TEXT,
                       "in_rate": _NUMBER_OR_TEXT,
                       "latency": _NUMBER_OR_TEXT,
                       "drop": _PROBABILITY}),
    "rank": {"type": "object", "additionalProperties": _table(
        {"out_rate": _NUMBER_OR_TEXT, "in_rate": _NUMBER_OR_TEXT})},
    "class": {"type": "object", "additionalProperties": _table(
        {"drop": _PROBABILITY, "priority": {"enum": ["high", "low"]}})},
    "priority": _table({
        "weight": {"anyOf": [{"type": "number", "minimum": 1},
                             {"const": "strict"}]},
        "low_buffer": _NUMBER_OR_TEXT}),
    "pair": {"type": "array", "items": _table(
        {"src": _RANK, "dst": _RANK, "latency": _NUMBER_OR_TEXT,
         "drop": _PROBABILITY, "class": _CLASS}, required=("src", "dst"))},
    "trace": {"type": "array", "items": {
        **_table({"ranks": {"anyOf": [{"const": "all"},
                                      {"type": "array", "items": _RANK}]},
                  "nic": {"enum": ["out", "in", "both"]},
                  "every": _NUMBER_OR_TEXT,
                  "rates": {"type": "array", "minItems": 1,
                            "items": _NUMBER_OR_TEXT},
                  "factors": {"type": "array", "minItems": 1,
                              "items": {"type": "number", "minimum": 0}},
                  "probabilities": {"type": "array", "items": {
                      "type": "number", "minimum": 0}}}),
        "oneOf": [{"required": ["rates"]}, {"required": ["factors"]}]}},
})

_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def where(path):
    """A TOML-like name of a place in the description: [rank.3] out_rate,
    [[pair]] #2 drop, ..."""
    parts = list(path)
    if not parts:
        return "network"
    head, rest = parts[0], parts[1:]
    if head in ("pair", "trace") and rest and isinstance(rest[0], int):
        text, rest = f"[[{head}]] #{rest[0] + 1}", rest[1:]
    elif head in ("rank", "class") and rest:
        text, rest = f"[{head}.{rest[0]}]", rest[1:]
    elif head in ("default", "priority", "rank", "class"):
        text = f"[{head}]"
    else:
        text, rest = str(head), rest
    return " ".join([text] + [str(p) for p in rest])


def check(cfg):
    """Raise ScheduleError naming the first place where ``cfg`` does not
    have the description's shape (the most specific error first)."""
    errors = sorted(_VALIDATOR.iter_errors(cfg),
                    key=lambda e: (-len(e.absolute_path), str(e.message)))
    if errors:
        e = errors[0]
        kind = ArgumentTypeError if e.validator == "type" else ScheduleError
        raise kind(f"network description: {where(e.absolute_path)}: "
                   f"{_plain(e)}")


def _plain(e):
    if e.validator == "additionalProperties":
        return e.message.replace("Additional properties are not allowed",
                                 "unknown key(s)")
    if e.validator == "oneOf":
        return "give either rates or factors"
    return e.message
