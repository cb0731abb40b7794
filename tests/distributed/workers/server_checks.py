"""``maze_run.py --server``: the maze run on one launched ``vllm serve`` shared by the DDP ranks, and what it records.

Every rank writes ``OUT/server{rank}.json``: the servers it started (its child processes running our launcher), the
push metrics it logged, and on rank 0, per step, whether each rank's rollout equals what rank 0's own engine returns
for that rank's prompts and seeds asked alone (the weights have not moved between the two: the push is after the
step), the number of pushes and the servers' process groups (the test checks none is left after the run).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import Logger

from lit_fgrpo.callbacks.rollout import RolloutCallback
from lit_fgrpo.distributed import gather_objects, prompt_seed
from lit_fgrpo.rollout.rollout_settings import TRAIN_STREAM
from lit_fgrpo.servers.engine import ServerEngine
from lit_fgrpo.servers.process import LAUNCH_MODULE
from lit_fgrpo.servers.ranks import RankedEngine

SERVER_MODEL = {  # configs/maze/server.yaml's: vLLM's CPU attention needs head_dim >= 32
    "model_type": "llama",
    "num_hidden_layers": 2,
    "max_position_embeddings": 160,
    "tie_word_embeddings": True,
    "hidden_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
}


def use_servers(settings: dict[str, Any], out: Path) -> None:
    """Turn maze_run's config into the shared-server run (one server, short completions)."""
    settings["rollout"] |= {
        "engine": "vllm_server",
        "engine_kwargs": {"launch": 1, "max_model_len": 160, "startup_timeout_s": 240, "restarts": 0},
        "sampling": settings["rollout"]["sampling"] | {"max_tokens": 8, "n": 4},
        "sync_tolerance": 1e-3,
    }
    settings["model"]["model_config"] = dict(SERVER_MODEL)
    # 5 held-out mazes, 2 per rank and batch: rank 0 has 2 batches, rank 1 one (its pass ends first and serves on)
    settings["data"]["num_val"] = 5
    settings["trainer"]["logger"] = {"class_path": "tests.distributed.workers.server_checks.RecordingLogger"}
    settings["trainer"]["callbacks"].append(
        {"class_path": "tests.distributed.workers.server_checks.ServerChecks", "init_args": {"out": str(out)}}
    )


class RecordingLogger(Logger):
    """Keeps what is logged on this rank (Lightning's own loggers write on rank 0 only)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.records.append((step, {k: float(v) for k, v in metrics.items()}))


def launched_children() -> list[int]:
    """This process's children running our ``vllm serve`` launcher."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
        if ppid == os.getpid() and LAUNCH_MODULE in cmdline and " serve " in cmdline:
            found.append(int(entry))
    return found


class ServerChecks(L.Callback):
    """Records the checks of ``OUT/server{rank}.json`` (see the module docstring)."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.children: list[int] = []
        self.same_as_alone: list[list[bool]] = []

    def _rollout_callback(self, trainer: L.Trainer) -> RolloutCallback:
        return next(c for c in trainer.callbacks if isinstance(c, RolloutCallback))  # type: ignore[attr-defined]

    def _inner(self, trainer: L.Trainer) -> ServerEngine | None:
        """The engine talking to the servers on this rank (rank 0's inside the shared one; None on the others)."""
        engine = self._rollout_callback(trainer).engine
        inner = engine.inner if isinstance(engine, RankedEngine) else engine
        assert inner is None or isinstance(inner, ServerEngine), type(inner)
        return inner

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.children = launched_children()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        rollout = batch.rollout  # attached by the RolloutCallback, first in the list
        positions = [record.position for record in batch.records]
        ranks = gather_objects((rollout.prompt_ids, positions, rollout.completion_ids))
        inner = self._inner(trainer)
        if inner is None:
            return
        sampling = self._rollout_callback(trainer).settings.train_sampling()
        assert sampling.seed is not None
        checks = []
        for prompts, rank_positions, completions in ranks:
            seeds = [prompt_seed(sampling.seed, p, trainer.global_step, TRAIN_STREAM) for p in rank_positions]
            checks.append(inner.generate(prompts, sampling, seeds).completion_ids == completions)
        self.same_as_alone.append(checks)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = trainer.logger
        assert isinstance(logger, RecordingLogger)
        inner = self._inner(trainer)
        groups = (
            [s.process.process.pid for s in inner.fleet.servers if s.process and s.process.process] if inner else []
        )
        summary = {
            "children": len(self.children),
            "pushes": [metrics for _, metrics in logger.records if "rollout/sync_seconds" in metrics],
            "push_steps": [step for step, metrics in logger.records if "rollout/sync_seconds" in metrics],
            "versions": inner.version if inner is not None else None,
            "same_as_alone": self.same_as_alone,
            "server_groups": groups,
        }
        (self.out / f"server{trainer.global_rank}.json").write_text(json.dumps(summary))
