"""Checks of servers given by URL (``engine_kwargs.urls``), before the run's first step.

A launched server runs our command line on the policy's own files; a server someone else started may not. Each
mistake is one line naming the URL, raised when the engine is built (before any training):

- it does not answer ``/health`` (checked by :func:`~lit_fgrpo.servers.launcher.open_fleet`);
- it cannot take weight pushes: no dev-mode ``/collective_rpc`` route, or not started with our worker extension;
- it serves another model: another vocabulary, hidden size or number of layers than the policy;
- its ``max_model_len`` is shorter than ``engine_kwargs.max_model_len`` (the context the run asks for).
"""

from __future__ import annotations

import json
from typing import Any

from torch import nn

from lit_fgrpo.engines.vllm_worker import WORKER_EXTENSION
from lit_fgrpo.servers.client import ServerClient, ServerRequestError
from lit_fgrpo.servers.errors import ServerError


def served_shape(client: ServerClient) -> dict[str, Any]:
    """The served model's shape (:meth:`~lit_fgrpo.engines.vllm_worker.WeightReceiver.model_info`).

    Raises:
        ServerError: the server cannot take weight pushes (no dev-mode routes, or not our worker extension).
    """
    try:
        results = client.collective_rpc("model_info")
        return dict(json.loads(results[0]))
    except (ServerRequestError, IndexError, TypeError, ValueError) as exc:
        raise ServerError(
            f"vllm server {client.url} (engine_kwargs.urls) cannot take weight pushes: /collective_rpc model_info "
            f"failed ({str(exc).replace(client.url, '')}); start it with VLLM_SERVER_DEV_MODE=1 and "
            f"--worker-extension-cls {WORKER_EXTENSION}"
        ) from None


def policy_shape(model: nn.Module) -> dict[str, int]:
    """The policy's vocabulary (its output embedding's rows), hidden size and number of layers (0 when unknown)."""
    config = getattr(model, "config", None)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    weight = getattr(head, "weight", None)
    vocab = int(weight.shape[0]) if weight is not None else int(getattr(config, "vocab_size", 0) or 0)
    return {
        "vocab_size": vocab,
        "hidden_size": int(getattr(config, "hidden_size", 0) or 0),
        "num_layers": int(getattr(config, "num_hidden_layers", 0) or 0),
    }


def check_url_server(client: ServerClient, model: nn.Module, max_model_len: int | None) -> None:
    """Refuse a server given by URL that cannot serve this run (see the module docstring).

    Args:
        client: the server's client (it answered ``/health``).
        model: the policy.
        max_model_len: the context the run asks for (``engine_kwargs.max_model_len``); None = not checked.

    Raises:
        ServerError: one line naming the URL and what does not match.
    """
    served, policy = served_shape(client), policy_shape(model)
    for key, label in (("vocab_size", "vocabulary"), ("hidden_size", "hidden size"), ("num_layers", "layers")):
        if policy[key] and served.get(key) != policy[key]:
            raise ServerError(
                f"vllm server {client.url} (engine_kwargs.urls) serves another model: {label} {served.get(key)} "
                f"({', '.join(served.get('architectures') or ['?'])}), the policy has {policy[key]}"
            )
    if max_model_len is not None and int(served.get("max_model_len") or 0) < max_model_len:
        raise ServerError(
            f"vllm server {client.url} (engine_kwargs.urls) has max_model_len {served.get('max_model_len')}, shorter "
            f"than engine_kwargs.max_model_len {max_model_len} the run needs"
        )
