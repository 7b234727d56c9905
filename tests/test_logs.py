"""partialcoll's logging: a NullHandler on the ``partialcoll`` logger (a
library prints nothing unless the program configures logging), the level
from PARTIALCOLL_LOG_LEVEL, and facts every rank shares said once."""
import logging

import pytest

import partialcoll  # noqa: F401  (sets the logger up)
from partialcoll.core import logs


def test_the_library_logger_has_a_null_handler():
    handlers = logging.getLogger("partialcoll").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


@pytest.mark.parametrize("value,level", [
    ("DEBUG", logging.DEBUG), ("info", logging.INFO),
    (" warning ", logging.WARNING), ("ERROR", logging.ERROR), ("15", 15)])
def test_log_level_from_the_environment(value, level):
    assert logs.level_from_environment(value) == level


def test_a_bad_log_level_is_refused_by_name():
    with pytest.raises(ValueError, match="PARTIALCOLL_LOG_LEVEL"):
        logs.level_from_environment("loud")


def test_setup_applies_the_environment_level(monkeypatch):
    root = logging.getLogger("partialcoll")
    before = root.level
    monkeypatch.setenv("PARTIALCOLL_LOG_LEVEL", "ERROR")
    try:
        logs.setup()
        assert root.level == logging.ERROR
        assert sum(isinstance(h, logging.NullHandler)
                   for h in root.handlers) == 1      # not added twice
    finally:
        root.setLevel(before)


def test_once_speaks_on_rank_0_only(caplog):
    log = logging.getLogger("partialcoll.test")
    with caplog.at_level(logging.WARNING, logger="partialcoll"):
        logs.once(log, 1, logging.WARNING, "from rank %d", 1)
        logs.once(log, 0, logging.WARNING, "from rank %d", 0)
    assert [r.getMessage() for r in caplog.records] == ["from rank 0"]


def test_for_this_rank_names_the_rank(caplog):
    log = logging.getLogger("partialcoll.test")
    with caplog.at_level(logging.WARNING, logger="partialcoll"):
        logs.for_this_rank(log, logging.WARNING, "only here")
    assert caplog.records[0].getMessage() == \
        f"rank {logs.world_rank()}: only here"


def test_shown_tells_a_program_handler_from_the_null_handler():
    """A warning reaches the console through ``warnings`` only where
    logging would not show it: a logger (and its parents) with nothing but
    NullHandlers.  A level above WARNING is the program's choice of
    silence, and counts as shown."""
    top = logging.getLogger("pc_shown_test")
    top.propagate = False           # away from the root (pytest's handlers)
    top.addHandler(logging.NullHandler())
    child = logging.getLogger("pc_shown_test.child")
    try:
        assert not logs.shown(top) and not logs.shown(child)
        top.setLevel(logging.ERROR)
        assert logs.shown(child)
        top.setLevel(logging.NOTSET)
        top.addHandler(logging.StreamHandler())
        assert logs.shown(top) and logs.shown(child)
    finally:
        top.handlers.clear()
