"""A log line below the configured level is dropped before any processor runs."""

import logging

import structlog

from maas_services.common.logging import configure_logging


def test_a_dropped_debug_line_runs_no_processor():
    root = logging.getLogger()
    saved = root.handlers[:], root.level, structlog.get_config()
    seen = []

    def spy(logger, method, event):
        seen.append(event["event"])
        return event

    try:
        configure_logging("test", level="info")
        processors = structlog.get_config()["processors"]
        # The spy sits just before the hand-off to the stdlib formatter.
        structlog.configure(processors=[*processors[:-1], spy, processors[-1]])
        log = structlog.get_logger("test_logging_levels")
        log.debug("below the level")
        log.info("at the level")
    finally:
        root.handlers[:], level, config = saved
        root.setLevel(level)
        structlog.configure(**config)
    assert seen == ["at the level"]
