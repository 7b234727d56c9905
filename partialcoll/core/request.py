"""Requests: what every non-blocking call returns.

:class:`Request` is the one interface (``test()``, ``wait(timeout)``) of
every non-blocking call of the library: a posted round of a schedule
(:class:`RoundRequest`), an allreduce, a partial collective's call, a
call that was complete when it returned (:class:`Done`).  A request
raises at ``wait()`` what went wrong on the progress thread.
"""
from __future__ import annotations

from typing import Any

from .slots import wait_seconds


class Request:
    """A non-blocking call in flight.

    ``test()`` says whether it has completed (without blocking; it raises
    if the call failed); ``wait(timeout=None)`` blocks, with the GIL
    released, until it has, and returns its result (raising
    :class:`~partialcoll.WaitTimeout` after ``timeout`` seconds)."""

    def test(self) -> bool:
        """True when the call has completed (raises if it failed)."""
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the call has completed; return its result."""
        raise NotImplementedError


class RoundRequest(Request):
    """One posted round of a non-persistent schedule.  ``upto``: the
    schedule's round count once this round has completed."""

    # sched: a Schedule, typed Any (schedule.py imports this module)
    def __init__(self, sched: Any, upto: int,
                 result: Any = None) -> None:
        self.schedule, self.upto, self._result = sched, upto, result

    def test(self) -> bool:
        return self.schedule.test(round=self.upto - 1)

    def wait(self, timeout: float | None = None) -> Any:
        """Block (GIL released) until the round completed; return its
        result (the ``result`` given, called first if it is callable)."""
        self.schedule.wait(round=self.upto - 1, timeout=timeout)
        return self._result() if callable(self._result) else self._result


class Done(Request):
    """A request that is complete when made (a call with nothing to
    communicate, a partial call that collected finished rounds)."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def test(self) -> bool:
        return True

    def wait(self, timeout: float | None = None) -> Any:
        wait_seconds(timeout)           # a bad timeout is refused anyway
        return self._result
