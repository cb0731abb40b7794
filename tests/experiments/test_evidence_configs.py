"""Every sweep config in configs/experiments/ parses with ``lit-fgrpo maze-sweep``'s parser; the GPU one is the paper's."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_fgrpo.experiments.maze_sweep import build_parser
from lit_fgrpo.tasks import MazeConfig, make_maze_splits
from lit_fgrpo.tasks.maze import maze_prompt_tokens
from lit_fgrpo.training.module import FGRPOModule

CONFIGS = sorted((Path(__file__).parents[2] / "configs" / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_parses(path: Path) -> None:
    args = build_parser().parse_args(["--config", str(path)])
    assert max(args.ks) <= args.eval_samples and args.num_test >= 256 and len(args.seeds) >= 1


def test_gpu_config_is_the_paper_maze_and_model() -> None:
    args = build_parser().parse_args(["--config", str(CONFIGS[0].parent / "maze_17x17_evidence.yaml")])
    assert args.accelerator == "gpu" and args.time_budget_s < 8 * 60 and len(args.seeds) >= 5
    maze = make_maze_splits(MazeConfig(args.maze_rows, args.maze_cols), 0, 0, 1, seed=0)["test"][0]
    assert len(maze.grid) == 17 and len(maze_prompt_tokens(maze)) <= args.model_config["max_position_embeddings"]
    module = FGRPOModule(policy={"model_config": args.model_config, "tokenizer": "builtin:maze"})
    params = sum(p.numel() for p in module.policy.parameters())
    assert 2.5e6 < params < 4.5e6, params  # the paper's "about 3M" (configs/maze_17x17.yaml: 3.9M)
