"""One package logger, honouring ``PRIMUS_TURBO_LOG_LEVEL`` (default WARNING)."""

from __future__ import annotations

import logging
import os

_LOGGER_NAME = "primus_turbo"
_warned: set[str] = set()


def get_logger() -> logging.Logger:
    """Return the package logger, configured once from ``PRIMUS_TURBO_LOG_LEVEL``."""
    logger = logging.getLogger(_LOGGER_NAME)
    if not getattr(logger, "_primus_configured", False):
        level_name = os.environ.get("PRIMUS_TURBO_LOG_LEVEL", "WARNING").strip().upper()
        level = logging.getLevelName(level_name)
        bad = not isinstance(level, int)
        if bad:
            level = logging.WARNING
        logger.setLevel(level)
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[primus_turbo %(levelname)s] %(message)s"))
            logger.addHandler(handler)
        if bad:  # a typo must not silently change what gets logged
            logger.warning(
                "PRIMUS_TURBO_LOG_LEVEL expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL, "
                "got %r; using WARNING",
                os.environ.get("PRIMUS_TURBO_LOG_LEVEL"),
            )
        logger.propagate = False
        logger._primus_configured = True  # type: ignore[attr-defined]
    return logger


def warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time it is seen in this process."""
    if message in _warned:
        return
    _warned.add(message)
    get_logger().warning(message)


def reset_warn_once() -> None:
    """Forget which warnings were already emitted (tests use this)."""
    _warned.clear()
