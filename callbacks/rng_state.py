"""``RNGStateCallback``: the torch, numpy and Python RNG states in checkpoints, restored when training resumes.

Lightning keeps callback state in ``checkpoint["callbacks"]``; the states are stored as tensors and plain Python
values so that ``torch.load(weights_only=True)`` (Lightning's default on resume) reads them.
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from typing_extensions import override


def capture_rng_state() -> dict[str, Any]:
    """The global RNG states as ``weights_only``-loadable values (numpy's key array as an int64 tensor)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": (
            str(name),
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ),
        "python": random.getstate(),
    }


def restore_rng_state(states: dict[str, Any]) -> None:
    """Set the global RNG states captured by :func:`capture_rng_state`."""
    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((name, keys.astype(np.uint32), pos, has_gauss, cached))
    random.setstate(states["python"])


class RNGStateCallback(L.Callback):
    """Save the global RNG states with every checkpoint; restore them at ``on_train_start`` of a resumed fit."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"rng_states": capture_rng_state()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict.get("rng_states")

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending:
            restore_rng_state(self._pending)
            self._pending = None
