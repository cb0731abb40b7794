"""The conversation warm start's resumable state: one file, written atomically, matched to its run by a fingerprint.

``<folder>/state.pt`` holds the step reached, the trained weights (the parameters that require a gradient: the LoRA
adapters, or every weight), the optimizer and schedule, the RNG and the losses so far. It is written every
``checkpoint_every`` steps and at the end (then without the optimizer: a finished warm start is only loaded). A kill
leaves the previous file or the new one (temporary file, then ``os.replace``), never half of one.

The fingerprint is a hash of the settings that shape the training (not the logging cadence) and of every
transcript's tokens: a state written for other transcripts or settings is not resumed (a warning says so, and the
warm start starts over), however the folder was reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_fgrpo.environments.transcripts import TranscriptTokens

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
"""The state's file name inside the warm start's folder."""

CADENCE = ("log_every", "eval_every", "checkpoint_every")
"""Settings that do not change what is trained (left out of the fingerprint)."""


def fingerprint(settings: Any, train: Sequence[TranscriptTokens], held_out: Sequence[TranscriptTokens]) -> str:
    """A hash of ``settings`` (a dataclass, without :data:`CADENCE`) and of every transcript's ids and loss mask."""
    fields = {k: v for k, v in dataclasses.asdict(settings).items() if k not in CADENCE}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
    for split in (train, held_out):
        digest.update(b"|split|")
        for row in split:
            digest.update(json.dumps([row.prompt_ids, row.completion_ids, row.loss_mask]).encode())
    return digest.hexdigest()


def trained_parameters(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that require a gradient, by name (the warm start's weights)."""
    return {name: p for name, p in policy.named_parameters() if p.requires_grad}


def save_state(folder: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``folder/state.pt`` atomically (temporary file in the same folder, then ``os.replace``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / STATE_FILE
    partial = folder / f".{STATE_FILE}.partial"
    torch.save(state, partial)
    os.replace(partial, path)
    return path


def training_state(
    step: int,
    policy: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    losses: list[float],
    held_out_losses: dict[int, float],
    key: str,
) -> dict[str, Any]:
    """What :func:`save_state` writes after ``step`` steps (CPU copies; no optimizer for a finished warm start)."""
    return {
        "step": step,
        "fingerprint": key,
        "weights": {name: p.detach().cpu().clone() for name, p in trained_parameters(policy).items()},
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "rng": torch.get_rng_state(),
        "losses": list(losses),
        "held_out_losses": dict(held_out_losses),
    }


def load_state(folder: str | Path | None, key: str) -> dict[str, Any] | None:
    """The saved state of this run (same fingerprint), or ``None`` (no folder, no file, or another run's state)."""
    if folder is None or not (Path(folder) / STATE_FILE).is_file():
        return None
    path = Path(folder) / STATE_FILE
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("fingerprint") != key:
        log.warning("warm start: %s was written for other transcripts or settings; starting over", path)
        return None
    return state


def restore_weights(policy: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy saved weights into the policy's trained parameters (same names, in place)."""
    params = trained_parameters(policy)
    if set(params) != set(weights):
        missing = sorted(set(params) ^ set(weights))[:3]
        raise ValueError(f"warm start state does not match the policy's trained parameters (e.g. {missing})")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name].to(device=p.device, dtype=p.dtype))


__all__ = [
    "STATE_FILE",
    "fingerprint",
    "load_state",
    "restore_weights",
    "save_state",
    "trained_parameters",
    "training_state",
]
