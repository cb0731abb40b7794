"""The one exception of the server engine: what went wrong, in one line naming the server (URL, log file)."""

from __future__ import annotations


class ServerError(RuntimeError):
    """A generation server failed: never became healthy, died with no restart left, or none is left at all."""
