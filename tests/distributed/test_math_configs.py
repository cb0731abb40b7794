"""The 7B math configs mean the paper's batch: 256 prompts per step over all ranks, whatever the layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lit_fgrpo.distributed import per_rank_mini_batch, per_rank_share

MATH = Path(__file__).resolve().parents[2] / "configs" / "math"
CONFIGS = sorted(path for path in MATH.glob("*.yaml") if path.stem != "base")


def _merged(overlay: Path) -> dict[str, Any]:
    """base.yaml with the overlay on top, merged key by key as jsonargparse merges repeated --config."""

    def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in top.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    return merge(yaml.safe_load((MATH / "base.yaml").read_text()), yaml.safe_load(overlay.read_text()) or {})


def test_there_are_math_configs() -> None:
    assert len(CONFIGS) == 6


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_global_prompts_per_step_is_the_papers_256(path: Path) -> None:
    settings = _merged(path)
    trainer, data, model = settings["trainer"], settings["data"], settings["model"]
    world = int(trainer.get("devices", 1)) * int(trainer.get("num_nodes", 1))
    global_prompts = int(data["loader"]["prompts_per_step"])  # global since issue 9: each rank takes its share
    assert global_prompts == 256, f"{path.name}: effective global prompts per step {global_prompts}"
    share = per_rank_share(global_prompts, world, "--data.loader.prompts_per_step")
    assert share * world == 256
    mini = model.get("batching", {}).get("mini_batch_prompts")
    if mini is not None:  # 4 optimizer steps of 64 prompts per rollout batch (paper Table 5)
        assert 256 % int(mini) == 0 and per_rank_mini_batch(int(mini), world) is not None
