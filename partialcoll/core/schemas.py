"""Settings checked declaratively: a JSON Schema (validated with the
``jsonschema`` package) that takes the values Python programs pass (NumPy
integers and floats, tuples as arrays), with one more keyword and the
messages partialcoll's errors give.

In a schema written for :func:`check`:

* ``"real": "finite"`` refuses NaN and the infinities, ``"real":
  "not-nan"`` NaN only (JSON Schema's ``minimum`` lets NaN through);
* ``"says"`` on a setting's schema is what the setting must be: the error
  reads "``name`` must be ``says``, got ``value``";
* ``"message"`` is a whole message, for a rule between settings; it is
  formatted with the settings (``{mode!r}``) and their names
  (``{max_updates_name}``).

A setting whose type is wrong raises :class:`~.errors.ArgumentTypeError`,
any other problem :class:`~.errors.ScheduleError`."""
import math
import numbers

import jsonschema

from .errors import ArgumentTypeError, ScheduleError


def _integer(checker, x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _number(checker, x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _array(checker, x):
    return isinstance(x, (list, tuple))


def _real(validator, kind, instance, schema):
    if validator.is_type(instance, "number"):
        x = float(instance)
        if math.isnan(x) or (kind == "finite" and math.isinf(x)):
            yield jsonschema.ValidationError(f"{instance!r} is not "
                                             f"{kind}")


Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, validators={"real": _real},
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _integer, "number": _number, "array": _array}))


def _is_type_error(e):
    if e.validator == "type":
        return True
    return e.validator in ("anyOf", "oneOf") and bool(e.context) and \
        all(c.validator == "type" for c in e.context)


def check(schema, values, names=None):
    """Raise the first problem of ``values`` (a dict of settings) against
    ``schema``, as ArgumentTypeError or ScheduleError; ``names`` renames
    settings (or items: ``{("stragglers", 0): "stragglers r"}``) in the
    messages."""
    names = names or {}
    errors = list(Validator(schema).iter_errors(values))
    if not errors:
        return
    e = min(errors, key=lambda e: (-len(e.absolute_path),
                                   "message" in e.schema))
    path = tuple(e.absolute_path)
    if "message" in e.schema:
        labels = {f"{k}_name": names.get(k, k) for k in values}
        raise ScheduleError(e.schema["message"].format(**values, **labels))
    name = names.get(path, names.get(path[0], path[0]) if path else "value")
    says = e.schema.get("says", e.message)
    kind = ArgumentTypeError if _is_type_error(e) else ScheduleError
    raise kind(f"{name} must be {says}, got {e.instance!r}")
