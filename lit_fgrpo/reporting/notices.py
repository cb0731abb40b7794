"""Warnings that must reach the terminal: a fallback the user has to know about (an older checkpoint, a skipped row).

``logging`` alone is not enough: MLflow's sqlite store runs Alembic migrations, whose ``logging.config.fileConfig``
disables every logger that existed before it (``disable_existing_loggers=True``), so a ``log.warning`` of ours
issued after the store opened is dropped. :func:`notice` logs the warning and, when no handler would put it on the
terminal, prints it to stderr as ``warning: ...``: shown once, never lost.
"""

from __future__ import annotations

import logging
import sys


def _reaches_terminal(logger: logging.Logger) -> bool:
    if logger.disabled or not logger.isEnabledFor(logging.WARNING):
        return False
    current: logging.Logger | None = logger
    found_handler = False
    while current is not None:
        for handler in current.handlers:
            found_handler = True
            stream = getattr(handler, "stream", None)
            if stream in (sys.stderr, sys.stdout) and handler.level <= logging.WARNING:
                return True
        if not current.propagate:
            break
        current = current.parent
    # No handler anywhere: logging's last resort prints WARNING records to stderr.
    return not found_handler and logging.lastResort is not None


def notice(logger: logging.Logger, message: str, *args: object) -> None:
    """``logger.warning(message, *args)``, also printed to stderr when logging would not show it on the terminal."""
    shown = _reaches_terminal(logger)
    logger.warning(message, *args)
    if not shown:
        print(f"warning: {message % args if args else message}", file=sys.stderr, flush=True)
