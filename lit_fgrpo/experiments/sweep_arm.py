"""One arm of the maze sweep: train from the warm start to a step count, resuming from the arm's last checkpoint.

An arm is a (group size N, focal gamma, method) triple; the method is F-GRPO/GRPO (``focal``) or one of the
success-rate family and its relatives with the settings of ``configs/maze/<method>.yaml``. Its folder holds
``last.ckpt`` (Lightning checkpoint: weights, optimizer, data-stream position, RNG and callback state), written every
``ckpt_every`` steps while it trains and again when ``fit`` returns, so a killed process loses at most
``ckpt_every`` steps and a rerun continues with exactly the batch and sampling seed that would have come next.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from lit_fgrpo.callbacks import GeneratedTokenBudget, RNGStateCallback, RolloutCallback
from lit_fgrpo.data.datamodule import PromptDataModule
from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.objectives.group_weights import GroupWeight
from lit_fgrpo.rollout.group_filter import DynamicSampling
from lit_fgrpo.settings_mapping import settings_from
from lit_fgrpo.training.module import FGRPOModule
from lit_fgrpo.training.module_settings import BatchingSettings, ObjectiveSettings

log = logging.getLogger(__name__)

CHECKPOINT = "last.ckpt"

Method = Literal["focal", "maxrl", "band", "dynamic", "gspo", "async"]
"""``focal``: GRPO (gamma 0) or F-GRPO; the others as in ``configs/maze/{maxrl,band,dynamic,gspo,async}.yaml``
(``async``: rollouts one policy version ahead, ``max_staleness=1``, on the ``hf_copy`` engine)."""
METHODS: tuple[str, ...] = get_args(Method)
WEIGHT_METHODS = ("maxrl", "band")
"""Methods whose group weight replaces the focal one (gamma must be 0)."""


@dataclass(frozen=True)
class Arm:
    """One sweep arm."""

    group_size: int
    """Completions per prompt N."""
    gamma: float
    """Focal exponent (0 = GRPO)."""
    method: Method = "focal"
    """The training method besides the focal weight (see :data:`Method`)."""

    @property
    def name(self) -> str:
        """Folder and run name, e.g. ``N8_g0.5`` or ``N8_g0_maxrl``."""
        suffix = "" if self.method == "focal" else f"_{self.method}"
        return f"N{self.group_size}_g{self.gamma:g}{suffix}"

    @classmethod
    def parse(cls, text: str) -> Arm:
        """``"N:gamma"`` or ``"N:gamma:method"`` (e.g. ``"8:0.5"``, ``"8:0:maxrl"``); bad values name ``--arms``."""
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            arm = cls(int(parts[0]), float(parts[1]), *parts[2:])  # type: ignore[arg-type]  # checked below
        except ValueError:
            raise ValueError(
                f"--arms: {text!r} is not 'N:gamma' or 'N:gamma:method' (e.g. '8:0.5', '8:0:maxrl')"
            ) from None
        if arm.group_size < 2 or arm.gamma < 0:
            raise ValueError(f"--arms: {text!r} needs N >= 2 and gamma >= 0")
        if arm.method not in METHODS:
            raise ValueError(f"--arms: {text!r}: method must be one of {', '.join(METHODS)}")
        if arm.method in WEIGHT_METHODS and arm.gamma != 0:
            raise ValueError(f"--arms: {text!r}: {arm.method} replaces the focal weight; give gamma 0")
        return arm

    def module_overrides(self) -> dict[str, dict[str, Any]]:
        """``FGRPOModule`` settings of the method (besides ``gamma``) by group, as in ``configs/maze/<method>.yaml``."""
        if self.method == "maxrl":
            return {"objective": {"group_weight": GroupWeight(kind="maxrl"), "scale_rewards": "none"}}
        if self.method == "band":
            return {"objective": {"group_weight": GroupWeight(kind="band", low=0.1, high=0.9)}}
        if self.method == "gspo":
            return {"objective": {"loss_type": "gspo"}, "batching": {"num_iterations": 2}}
        if self.method == "async":
            return {"objective": {"importance_correction": "token"}}
        return {}

    def module(self, module_args: dict[str, Any]) -> FGRPOModule:
        """The arm's module: ``module_args`` (every group but the objective) with the arm's gamma and method."""
        overrides = self.module_overrides()
        objective = ObjectiveSettings(gamma=self.gamma, **overrides.get("objective", {}))
        batching = settings_from(BatchingSettings, module_args.get("batching", {}), "--model.batching")
        batching = dataclasses.replace(batching, **overrides.get("batching", {}))
        return FGRPOModule(**(module_args | {"objective": objective, "batching": batching}))

    def dynamic_sampling(self) -> DynamicSampling | None:
        """DAPO's dynamic sampling for the ``dynamic`` method (configs/maze/dynamic.yaml), else None."""
        return DynamicSampling(max_rounds=4, oversample=2.0) if self.method == "dynamic" else None


def checkpoint_step(folder: Path) -> int:
    """RL steps already in the arm's ``last.ckpt`` (0 when there is none)."""
    path = folder / CHECKPOINT
    if not path.exists():
        return 0
    # Our own file, written by train_arm; only its step counter is read.
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


@dataclass
class ArmRun:
    """What one ``fit`` call of an arm left behind."""

    policy: torch.nn.Module
    step: int
    """RL steps the arm has now trained in total."""
    trained: int
    """RL steps this call trained (counted, not inferred from the step counter)."""
    seconds: float
    """Wall time of this call's ``fit``."""
    start_pass_at_k: dict[str, float]
    """Pre-RL validation pass@k of the arm (restored from the checkpoint on resume)."""
    generated_tokens: int = 0
    """Completion tokens the arm has generated in total (all calls; discarded dynamic-sampling groups included)."""
    budget_reached: bool = False
    """Whether the arm stopped on its generated-token budget (it is then finished, whatever its step count)."""


class _StopAfter(L.Callback):
    """Counts the RL steps this ``fit`` trained; ends it after the step that crosses a deadline (None = never).

    Lightning's own ``max_time`` is not used: its elapsed time is stored in the checkpoint and counts across
    resumed calls, so a piece of a multi-sitting run would stop at once.
    """

    def __init__(self, seconds: float | None) -> None:
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.steps = 0

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.steps += 1
        if self.deadline is not None and time.monotonic() > self.deadline:
            trainer.should_stop = True


def train_arm(
    folder: Path,
    arm: Arm,
    base_state: dict[str, torch.Tensor],
    module_args: dict[str, Any],
    data_args: dict[str, Any],
    target_step: int,
    val_samples: int,
    seed: int,
    max_tokens: int,
    ckpt_every: int,
    accelerator: str = "cpu",
    max_seconds: float | None = None,
    logger: Any = None,
    token_budget: int | None = None,
) -> ArmRun:
    """Train ``arm`` from the warm start (or its checkpoint) until ``target_step`` RL steps or ``max_seconds``.

    Args:
        folder: The arm's folder (``last.ckpt`` lives here).
        arm: Group size and gamma.
        base_state: Warm-start weights (ignored when a checkpoint is restored).
        module_args: ``FGRPOModule`` keyword arguments except ``objective`` (the arm's gamma and method).
        data_args: ``PromptDataModule`` keyword arguments.
        target_step: Train until the arm has this many RL steps.
        val_samples: Samples per validation maze for the pre-RL check.
        seed: Sampling seed of the ``RolloutCallback`` (step s samples with seed + s) and of ``seed_everything``.
        max_tokens: Completion cap.
        ckpt_every: Write ``last.ckpt`` every this many steps while training.
        accelerator: Lightning accelerator.
        max_seconds: Stop training (and checkpoint) after this many seconds (None = no limit).
        logger: A Lightning logger or None.
        token_budget: Also stop once the arm has generated this many completion tokens (None = steps only).
    """
    folder.mkdir(parents=True, exist_ok=True)
    # With manual optimisation the checkpoint holds the post-step state, which is exactly what resuming needs.
    warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
    ckpt = folder / CHECKPOINT
    module = arm.module(module_args)
    module.policy.load_state_dict(base_state)
    datamodule = PromptDataModule(**data_args)
    done_id = int(module.tokenizer.convert_tokens_to_ids("DONE"))
    sampling = SamplingConfig(n=arm.group_size, temperature=1.0, max_tokens=max_tokens, stop_token_ids=[done_id])
    rollout = RolloutCallback(
        engine="hf_copy" if arm.method == "async" else "hf", sampling=sampling, val_samples=val_samples,
        reward_funcs=["maze"], seed=seed, dynamic_sampling=arm.dynamic_sampling(),
        max_staleness=1 if arm.method == "async" else 0,
    )  # fmt: skip
    pace = _StopAfter(max_seconds)
    # Always counted (a huge budget never stops), so that every arm reports what it generated.
    budget = GeneratedTokenBudget(token_budget if token_budget is not None else 2**62)
    checkpoint = ModelCheckpoint(dirpath=folder, save_last=True, every_n_train_steps=ckpt_every, save_top_k=0)
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, max_steps=target_step, limit_val_batches=0, num_sanity_val_steps=0,
        logger=logger if logger is not None else False, enable_progress_bar=False, enable_model_summary=False,
        log_every_n_steps=10, callbacks=[rollout, RNGStateCallback(), budget, checkpoint, pace],  # RNG: exact resume
    )  # fmt: skip
    L.seed_everything(seed, verbose=False)
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt) if ckpt.exists() else None)
    seconds = time.perf_counter() - start
    trainer.save_checkpoint(ckpt)
    log.info("arm %s: %d of %d steps (%.0f s this call)", arm.name, trainer.global_step, target_step, seconds)
    return ArmRun(
        module.policy, trainer.global_step, pace.steps, seconds, dict(rollout.start_pass_at_k), budget.total,
        token_budget is not None and budget.reached,
    )  # fmt: skip
