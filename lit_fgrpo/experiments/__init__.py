"""Experiments built from the library's parts: the paper's §6 maze sweep (resumable) and its pre-registered verdict.

Imported lazily, so ``python -m lit_fgrpo.experiments.maze_sweep`` runs without a double import.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "run_maze_sweep": "lit_fgrpo.experiments.maze_sweep",
    "main": "lit_fgrpo.experiments.maze_sweep",
    "combine_sweeps": "lit_fgrpo.experiments.maze_sweep",
    "report": "lit_fgrpo.experiments.evidence_report",
    "RarePool": "lit_fgrpo.experiments.rare_pool",
    "build_rare_pool": "lit_fgrpo.experiments.rare_pool",
    "sample_correct_trajectories": "lit_fgrpo.experiments.rare_pool",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_fgrpo.experiments' has no attribute {name!r}")
