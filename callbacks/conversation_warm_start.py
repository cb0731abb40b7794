"""``ConversationWarmStart``: a supervised warm start on chat transcripts (tool use) before RL, as a phase of ``fit``.

A model that never calls its tool gives RL nothing to reinforce; a few hundred transcripts of the tool used right fix
that (the "cold start" of agentic RL recipes). At the start of ``fit`` the callback reads the transcripts (JSONL or
Parquet files, or a generator such as
:func:`lit_fgrpo.environments.calculator_transcripts.calculator_transcripts`), renders them in the episodes' token
layout with the episodes' tools (:mod:`lit_fgrpo.environments.transcripts`), trains the policy on the assistant's
tokens (:mod:`lit_fgrpo.training.conversation_sft`), and logs ``warm_start/loss`` and ``warm_start/held_out_loss``
(at steps ``step - steps``: before RL's step 0). Then RL starts from the warm-started policy (the engine is pushed the
new weights before its first sample).

With ``evaluate_base`` the held-out questions are first answered by the model as it was before the warm start (the
base model): logged as ``val/*`` at the warm start's first step and shown by
:class:`~lit_fgrpo.callbacks.PassAtKReport` as the first of three rows (base model, after the warm start, after RL).

Resumable: its state goes to ``<trainer.default_root_dir>/warm_start/`` (``folder``), so a run killed during the warm
start goes on from its last saved step, and one killed later does not train it again; ``--ckpt_path`` (an RL
checkpoint) skips it. On its own: ``lit-fgrpo fit ... --trainer.max_steps 0`` runs the warm start and saves the
policy, or call :func:`lit_fgrpo.training.conversation_sft.conversation_warm_start` directly.
"""

from __future__ import annotations

import inspect
import random
from pathlib import Path
from typing import Any, cast

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lit_fgrpo.callbacks.rollout import REPORTED, RolloutCallback
from lit_fgrpo.data.datamodule import PromptDataModule
from lit_fgrpo.data.transcripts import (
    BadRows,
    TranscriptRow,
    generated_transcripts,
    question_key,
    read_transcripts,
    tokenize_transcripts,
)
from lit_fgrpo.environments import base as environment_base
from lit_fgrpo.environments.transcripts import TranscriptTokens
from lit_fgrpo.environments.turns import ChatTurns
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.rollout.consumer import PolicyHolder, check_consumer
from lit_fgrpo.training.conversation_sft import FLAG, ConversationSFTSettings, conversation_warm_start


def episode_tool_schemas(environment: Any, environment_args: Any, tools: Any = ()) -> list[dict[str, Any]]:
    """The tool schemas an episode's prompt lists for ``--rollout.environment`` (and ``--rollout.tools``).

    Raises:
        ConfigError: For an environment routed by the rows (a mapping): name the one to use in ``environment``.
    """
    if isinstance(environment, dict):
        raise ConfigError(f"{FLAG}.environment: --rollout.environment is a mapping; name the transcripts' environment")
    load_all = getattr(environment_base, "load_environments", None)
    if load_all is not None and (environment is not None or tools):
        return list(load_all(environment, environment_args, list(tools or ())).tool_schemas(""))
    if environment is None:
        return []
    return list(environment_base.load_environment(environment, environment_args).tool_schemas())


def _context(policy: Any, rollout: Any) -> int | None:
    """The tokens an episode may fill: the policy's positions, and the engine's ``max_model_len`` when smaller."""
    limits = [getattr(getattr(policy, "config", None), "max_position_embeddings", None)]
    limits.append((getattr(rollout, "engine_kwargs", None) or {}).get("max_model_len"))
    values = [int(v) for v in limits if isinstance(v, int) and v > 0]
    return min(values) if values else None


class ConversationWarmStart(L.Callback):
    """Supervised steps on chat transcripts before the first RL step (see the module docstring).

    Args:
        transcripts: JSONL or Parquet file(s) with a ``messages`` column (tool calls as ``<tool_call>{...}</tool_call>``
            text in the assistant's content, each answered by a ``tool`` message).
        generator: ``package.module:function`` returning ``{"messages": [...]}`` rows, called with
            ``generator_args`` (and ``records=``, the training records, when it takes them).
        generator_args: Keyword arguments of ``generator``.
        environment: The environment whose tools the prompts list (default: ``--rollout.environment``).
        environment_args: Its constructor arguments (default: ``--rollout.environment_args``).
        max_length: Longest transcript in tokens (default: the policy's context, or the engine's ``max_model_len``).
        bad_rows: ``"error"``: a transcript no episode could produce stops the run, naming its file and row;
            ``"skip"``: it is left out and counted.
        folder: Where the resumable state goes (default ``<trainer.default_root_dir>/warm_start``).
        steps: Optimizer steps (0: off).
        batch_size: Transcripts per step over all ranks.
        micro_batch_rows: Transcripts per forward/backward on one rank.
        micro_batch_tokens: At most this many padded tokens per forward/backward as well (rows x the longest);
            None: rows only.
        lr: AdamW's peak learning rate.
        weight_decay: AdamW's weight decay.
        schedule: "constant" or "cosine" (to zero at the last step).
        warmup_steps: Linear warm-up of the rate, in steps.
        max_grad_norm: Gradient clip.
        seed: Seed of the order and of the held-out draw.
        held_out: Transcripts kept out of training for ``warm_start/held_out_loss``.
        eval_every: Held-out loss every this many steps (0: before and after only).
        log_every: Loss logged every this many steps.
        checkpoint_every: Resumable state saved every this many steps (0: only when done).
        evaluate_base: Answer the held-out questions before the warm start too (needs a ``RolloutCallback``; costs
            one held-out evaluation): the base model's row of the report.
    """

    def __init__(
        self,
        transcripts: str | list[str] | None = None,
        generator: str | None = None,
        generator_args: dict[str, Any] | None = None,
        environment: str | None = None,
        environment_args: dict[str, Any] | None = None,
        max_length: int | None = None,
        bad_rows: BadRows = "error",
        folder: str | None = None,
        steps: int = 100,
        batch_size: int = 16,
        micro_batch_rows: int = 8,
        micro_batch_tokens: int | None = None,
        lr: float = 2e-4,
        weight_decay: float = 0.0,
        schedule: str = "cosine",
        warmup_steps: int = 0,
        max_grad_norm: float = 1.0,
        seed: int = 0,
        held_out: int = 32,
        eval_every: int = 0,
        log_every: int = 10,
        checkpoint_every: int = 50,
        evaluate_base: bool = False,
    ) -> None:
        if transcripts is None and generator is None and steps > 0:
            raise ConfigError(f"{FLAG} needs transcripts (files) or a generator")
        if bad_rows not in ("error", "skip"):
            raise ConfigError(f"{FLAG}.bad_rows must be 'error' or 'skip', got {bad_rows!r}")
        self.files = [transcripts] if isinstance(transcripts, str) else list(transcripts or [])
        self.generator, self.generator_args = generator, dict(generator_args or {})
        self.environment, self.environment_args = environment, environment_args
        self.max_length, self.bad_rows, self.folder = max_length, bad_rows, folder
        self.settings = ConversationSFTSettings(
            steps=steps, batch_size=batch_size, micro_batch_rows=micro_batch_rows,
            micro_batch_tokens=micro_batch_tokens, lr=lr, weight_decay=weight_decay,
            schedule=schedule, warmup_steps=warmup_steps, max_grad_norm=max_grad_norm,  # type: ignore[arg-type]
            seed=seed, held_out=held_out, eval_every=eval_every, log_every=log_every,
            checkpoint_every=checkpoint_every,
        )  # fmt: skip
        self.done = False
        self.evaluate_base = evaluate_base
        self.base_values: dict[str, float] = {}
        """Held-out pass@k (with intervals) and the tool-call share of the model before the warm start
        (``evaluate_base``); empty otherwise."""

    # ------------------------------------------------------------------ what it trains on
    def rollout_settings(self, trainer: L.Trainer) -> Any:
        """The run's rollout settings (its environment and engine), or ``None`` without a rollout callback."""
        found = [
            c.settings
            for c in getattr(trainer, "callbacks", [])
            if hasattr(getattr(c, "settings", None), "environment")
        ]
        return found[0] if found else None

    def chat_turns(self, tokenizer: Any, rollout: Any) -> ChatTurns:
        """The episodes' chat turns: this tokenizer, the environment's tools."""
        if self.environment is not None:
            schemas = episode_tool_schemas(self.environment, self.environment_args)
        elif rollout is not None:
            schemas = episode_tool_schemas(rollout.environment, rollout.environment_args, getattr(rollout, "tools", ()))
        else:
            schemas = []
        call_format = getattr(rollout, "tool_call_format", None)  # the episodes' call format, where runs choose one
        if call_format is not None and "call_format" in inspect.signature(ChatTurns).parameters:
            return ChatTurns(tokenizer, tools=schemas, call_format=call_format)
        return ChatTurns(tokenizer, tools=schemas)

    def rows(self, datamodule: Any) -> list[TranscriptRow]:
        """Every transcript, from the files then the generator (with the training records)."""
        rows = [row for path in self.files for row in read_transcripts(path)]
        if self.generator is not None:
            records = datamodule.splits.get("train", []) if isinstance(datamodule, PromptDataModule) else []
            rows += generated_transcripts(self.generator, self.generator_args, records, f"{FLAG}.generator")
        return rows

    def split(self, examples: list[TranscriptTokens]) -> tuple[list[TranscriptTokens], list[TranscriptTokens]]:
        """Training and held-out transcripts: ``held_out`` drawn with the seed."""
        count = self.settings.held_out
        if count >= len(examples):
            raise ConfigError(f"{FLAG}.held_out={count} leaves no training transcript of {len(examples)}")
        order = list(range(len(examples)))
        random.Random(self.settings.seed).shuffle(order)
        return [examples[i] for i in sorted(order[count:])], [examples[i] for i in sorted(order[:count])]

    # ------------------------------------------------------------------ hooks
    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.done or self.settings.steps == 0 or trainer.ckpt_path is not None:
            return
        check_consumer(pl_module, PolicyHolder, FLAG)
        holder = cast(PolicyHolder, pl_module)
        tokenizer, rollout = holder.tokenizer, self.rollout_settings(trainer)
        datamodule = getattr(trainer, "datamodule", None)
        held = set()
        if isinstance(datamodule, PromptDataModule):
            for name in ("val", "test"):
                held |= {question_key(r.messages) for r in datamodule.splits.get(name, []) if r.messages}
        max_length = self.max_length or _context(holder.policy, rollout)
        data = tokenize_transcripts(
            self.rows(datamodule), self.chat_turns(tokenizer, rollout), max_length, self.bad_rows, held
        )
        train, held_out = self.split(data.examples)
        steps = self.settings.steps
        rollout_callbacks = [c for c in trainer.callbacks if isinstance(c, RolloutCallback)]  # type: ignore[attr-defined]
        if self.evaluate_base:
            if not rollout_callbacks:
                raise ConfigError(f"{FLAG}.evaluate_base needs a RolloutCallback (the run's held-out evaluation)")
            values = rollout_callbacks[0].evaluate_held_out(trainer, pl_module, "pass@k of the base model")
            self.base_values = {k: v for k, v in values.items() if k.startswith(REPORTED)}
            if trainer.logger is not None and values:
                trainer.logger.log_metrics({f"val/{k}": v for k, v in values.items()}, step=-steps)

        def on_log(step: int, values: dict[str, float]) -> None:
            if trainer.logger is not None:
                trainer.logger.log_metrics({f"warm_start/{k}": v for k, v in values.items()}, step=step - steps)

        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        folder = Path(self.folder) if self.folder else Path(trainer.default_root_dir) / "warm_start"
        result = conversation_warm_start(holder.policy, train, held_out, self.settings, int(pad), folder, on_log)
        for callback in rollout_callbacks:
            callback.policy_changed()  # its engine may hold the weights evaluated above
        skipped = sum(data.skipped.values())
        losses = f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}" if result.losses else "no steps"
        held_losses = sorted(result.held_out_losses.items())
        if held_losses:
            losses += f", held-out loss {held_losses[0][1]:.3f} -> {held_losses[-1][1]:.3f}"
        rank_zero_info(
            f"warm start: {len(train)} transcripts ({len(held_out)} held out, {skipped} skipped), {steps} steps, "
            f"{losses}" + (f" (resumed at step {result.resumed_from})" if result.resumed_from else "")
        )
        self.done = True

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done, "base_values": dict(self.base_values)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.done = bool(state_dict.get("done", False))
        self.base_values = dict(state_dict.get("base_values", {}))
