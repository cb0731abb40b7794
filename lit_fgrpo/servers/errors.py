"""The one exception of the server engine: what went wrong, in one line naming the server (URL, log file)."""

from __future__ import annotations

from lit_fgrpo.errors import ServiceError


class ServerError(ServiceError, RuntimeError):
    """A generation server failed: never became healthy, died with no restart left, or none is left at all.

    A :class:`~lit_fgrpo.errors.ServiceError`: when it ends a run, ``lit-fgrpo`` prints its one line and exits 2.
    """
