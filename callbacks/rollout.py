"""``RolloutCallback``: owns the generation engine, samples and scores rollouts, keeps the engine in sync.

Before every training batch it samples G completions per prompt (``sampling.n``), scores them with the reward
functions and the correctness verdict, and hands the module a :class:`~lit_fgrpo.rollout.batch.RolloutBatch`.
After optimizer steps it pushes the policy's weights into the engine (every ``sync_every`` steps) and checks
the sync by comparing the engine's log-probs with the trainer's on a small probe (logged as
``rollout/sync_logprob_delta``; a gap beyond ``sync_tolerance`` raises). Validation samples ``val_samples``
completions per held-out prompt; the module logs ``val/pass_at_k``.

Engine life cycle. A separate engine (vLLM) is built in ``setup`` from the policy as it is then, which is not
yet the policy that trains: a warm start (``on_fit_start``) or a restored checkpoint (``fit(ckpt_path=...)``)
changes the weights afterwards. Every ``fit``/``validate``/``test`` therefore marks the engine stale, and the
first rollout of the run (sanity check, start-of-run validation or the first training batch, whichever comes
first) pushes and checks the weights before it samples. With ``enable_sleep_mode`` on a GPU the engine sleeps
while the trainer runs its optimizer step and wakes before the next generation or weight push.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import replace
from typing import Any, Literal

import lightning as L
import torch

from lit_fgrpo.data.records import PromptRecord, columns_per_completion
from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.rewards import resolve_reward, reward_name, score_completions
from lit_fgrpo.rollout.base import RolloutEngine, SamplingConfig
from lit_fgrpo.rollout.batch import RolloutBatch, pad_rollouts
from lit_fgrpo.rollout.scoring import WeightSyncError, check_logprob_gap, policy_logprobs
from lit_fgrpo.rollout.select import build_engine

log = logging.getLogger(__name__)


def _as_any(module: L.LightningModule) -> Any:
    """The module with its FGRPOModule attributes (tokenizer, policy, ...) visible to the type checker."""
    return module


class RolloutCallback(L.Callback):
    """Generate, score and hand over rollouts; sync engine weights.

    Args:
        engine: "hf" (transformers ``generate`` on the policy itself), "vllm" (colocated vLLM), or "auto"
            (vLLM when installed, else HF).
        sampling: sampling settings for training rollouts; ``sampling.n`` is the group size G (>= 2).
        val_samples: completions per held-out prompt in validation/test (>= the largest pass@k k).
        val_temperature: sampling temperature for validation (default: the training temperature).
        reward_funcs: reward functions by built-in name (math_answer, maze, reasoning_gym,
            reasoning_gym_correct) or dotted path ``pkg.module:function``.
        reward_weights: one weight per reward function (default all 1).
        correctness: the function whose score >= ``correct_threshold`` defines "correct" (mu_hat); default the
            first reward function. Kept apart from shaping terms.
        correct_threshold: score at or above which a completion is correct.
        sync_every: push weights into the engine every k optimizer steps (and before validation, so that
            pass@k always measures the current policy).
        sync_tolerance: largest allowed |logp_engine - logp_trainer| on the probe after a sync. Both sides are
            compared at temperature 1, whatever the sampling temperature. 1e-3 suits a float32 engine; a bf16
            vLLM engine on GPU needs a looser value (about 0.25).
        sync_probe_rows: rows of the last rollout used as the probe (0 disables the check).
        mask_truncated_completions: no loss on completions cut at ``max_tokens`` (DAPO overlong filtering).
        validate_at_start: run the validation sampling once before the first RL step (logged at step 0,
            printed with the final values at the end of fit).
        log_samples_every: log a table of sample completions every this many steps (0 = never).
        engine_kwargs: extra keyword arguments for the vLLM engine (gpu_memory_utilization, dtype,
            max_model_len, enable_sleep_mode, ...).
        hf_chunk_size: most rows per HF ``generate`` call.
        seed: base sampling seed; training step s samples with seed + s, so a resumed run repeats exactly.
    """

    def __init__(
        self,
        engine: Literal["auto", "vllm", "hf"] = "hf",
        sampling: SamplingConfig | None = None,
        val_samples: int = 16,
        val_temperature: float | None = None,
        reward_funcs: list[str] | None = None,
        reward_weights: list[float] | None = None,
        correctness: str | None = None,
        correct_threshold: float = 0.5,
        sync_every: int = 1,
        sync_tolerance: float = 1e-3,
        sync_probe_rows: int = 2,
        mask_truncated_completions: bool = False,
        validate_at_start: bool = True,
        log_samples_every: int = 50,
        engine_kwargs: dict[str, Any] | None = None,
        hf_chunk_size: int = 512,
        seed: int = 0,
    ) -> None:
        self.engine_kind = engine
        self.sampling = sampling or SamplingConfig()
        if self.sampling.n < 2:
            raise ValueError(
                f"RolloutCallback.sampling.n (the group size G) must be >= 2 for group-relative advantages, "
                f"got {self.sampling.n}"
            )
        if val_samples < 1:
            raise ValueError(f"RolloutCallback.val_samples must be >= 1, got {val_samples}")
        if sync_every < 1:
            raise ValueError(f"RolloutCallback.sync_every must be >= 1, got {sync_every}")
        if engine not in ("auto", "vllm", "hf"):
            raise ValueError(f"RolloutCallback.engine must be 'auto', 'vllm' or 'hf', got {engine!r}")
        self.val_samples = val_samples
        self.val_temperature = val_temperature
        names = reward_funcs or ["maze"]
        self.reward_funcs = [resolve_reward(name) for name in names]
        if reward_weights is not None and len(reward_weights) != len(names):
            raise ValueError(
                f"RolloutCallback.reward_weights has {len(reward_weights)} values for {len(names)} reward_funcs"
            )
        self.reward_weights = reward_weights
        self.correctness = resolve_reward(correctness) if correctness else self.reward_funcs[0]
        self.correct_threshold = correct_threshold
        self.sync_every = sync_every
        self.sync_tolerance = sync_tolerance
        self.sync_probe_rows = sync_probe_rows
        self.mask_truncated = mask_truncated_completions
        self.validate_at_start = validate_at_start
        self.log_samples_every = log_samples_every
        self.engine_kwargs = engine_kwargs or {}
        self.hf_chunk_size = hf_chunk_size
        self.seed = seed
        self.engine: RolloutEngine | None = None
        self.last_sync_step = -1
        self.start_pass_at_k: dict[str, float] = {}
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._probe: tuple[list[list[int]], list[list[int]]] | None = None
        # True while the engine may hold other weights than the policy (built before a warm start or before a
        # checkpoint was restored); the next rollout syncs first.
        self._engine_stale = False

    # ------------------------------------------------------------------ engine
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        ks = getattr(getattr(pl_module, "val_pass_at_k", None), "ks", [1])
        if self.val_samples < max(ks):
            raise ValueError(
                f"RolloutCallback.val_samples={self.val_samples} is fewer than the largest pass@k k={max(ks)} "
                "(--model.val_pass_at_k); unbiased pass@k needs n >= k"
            )
        if self.engine is None:
            self._workdir = tempfile.TemporaryDirectory(prefix="lit_fgrpo_engine_")
            tokenizer: Any = _as_any(pl_module).tokenizer
            self.engine = build_engine(
                self.engine_kind,
                pl_module.policy,  # type: ignore[arg-type]
                tokenizer,
                self._workdir.name,
                hf_chunk_size=self.hf_chunk_size,
                **self.engine_kwargs,
            )
            self.pad_token_id: int = (
                tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            )
        module_temperature = getattr(getattr(pl_module, "hparams", None), "temperature", None)
        if module_temperature is not None and float(module_temperature) != self.sampling.temperature:
            # The engine reports log_softmax(z / sampling.temperature); the module divides its logits by its own
            # temperature. Different values make the importance weights and logprob_mismatch meaningless.
            log.warning(
                "RolloutCallback.sampling.temperature=%s differs from the module's temperature=%s: the sampling "
                "log-probs and the trainer's log-probs are then at different temperatures",
                self.sampling.temperature,
                module_temperature,
            )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()
        self.engine = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def _sleep(self) -> None:
        """Free the engine's accelerator memory for the optimizer step (no-op unless sleep mode is on)."""
        sleep = getattr(self.engine, "sleep", None)
        if sleep is not None:
            sleep()

    def _wake(self) -> None:
        """Bring a sleeping engine back before it generates or scores (no-op when awake)."""
        wake_up = getattr(self.engine, "wake_up", None)
        if wake_up is not None:
            wake_up()

    def _sync(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert self.engine is not None
        self._wake()  # a sleeping engine (level 1) has its weights offloaded; reload into live buffers
        start = time.perf_counter()
        self.engine.sync_weights(pl_module.policy)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - start
        self.last_sync_step = trainer.global_step
        self._engine_stale = False
        metrics = {"rollout/sync_seconds": elapsed}
        if self.sync_probe_rows > 0 and self._probe is not None:
            metrics["rollout/sync_logprob_delta"] = self._check_sync(pl_module)
        if trainer.logger is not None:
            trainer.logger.log_metrics(metrics, step=trainer.global_step)

    def _ensure_synced(
        self, trainer: L.Trainer, pl_module: L.LightningModule, prompt_ids: list[list[int]], evaluation: bool
    ) -> None:
        """Push the weights before sampling when the engine may be behind the policy.

        The engine is behind when it was built before a warm start or a checkpoint restore (``_engine_stale``),
        and, for evaluation, when optimizer steps happened since the last push (``sync_every`` > 1).
        """
        behind = evaluation and trainer.state.fn == "fit" and self.last_sync_step != trainer.global_step
        if not (self._engine_stale or behind):
            return
        if self._probe is None and self.sync_probe_rows > 0 and prompt_ids:
            # No rollout yet to probe with: force the prompts' own tokens as completions. Any tokens do; the
            # check compares two models on the same forced sequence.
            rows = [prompt_ids[r % len(prompt_ids)] for r in range(self.sync_probe_rows)]
            self._probe = (rows, [p[-8:] for p in rows])
        self._sync(trainer, pl_module)

    @torch.no_grad()
    def _check_sync(self, pl_module: L.LightningModule) -> float:
        """Engine vs trainer log-probs on a few rows of the last rollout; raises beyond the tolerance.

        Both sides are at temperature 1: the engine's ``score`` is, and the trainer's log-probs are computed
        with ``temperature=1.0`` here, so a sampling temperature != 1 does not enter the comparison.
        """
        assert self.engine is not None and self._probe is not None
        self._wake()
        prompts, completions = self._probe
        engine_lp = self.engine.score(prompts, completions)
        policy: Any = pl_module.policy
        trainer_lp = policy_logprobs(policy, prompts, completions, self.pad_token_id, temperature=1.0)
        where = f"RolloutCallback weight sync at step {pl_module.global_step} (sync_tolerance)"
        return check_logprob_gap(engine_lp, trainer_lp, self.sync_tolerance, where)

    # ------------------------------------------------------------------ rollouts
    def make_rollout(
        self, pl_module: L.LightningModule, records: list[PromptRecord], sampling: SamplingConfig
    ) -> RolloutBatch:
        """Sample ``sampling.n`` completions for each record, score them and pack a RolloutBatch."""
        assert self.engine is not None, "RolloutCallback.setup has not run"
        prompt_ids = [record.prompt_ids for record in records]
        self._wake()
        start = time.perf_counter()
        generation = self.engine.generate(prompt_ids, sampling)
        gen_seconds = time.perf_counter() - start
        tokenizer: Any = _as_any(pl_module).tokenizer
        completions = tokenizer.batch_decode(generation.completion_ids, skip_special_tokens=True)
        prompts = [record.prompt for record in records for _ in range(sampling.n)]
        columns: dict[str, Any] = dict(columns_per_completion(records, sampling.n))
        columns["completion_length"] = [len(ids) for ids in generation.completion_ids]
        scored = score_completions(
            prompts,
            completions,
            columns,
            self.reward_funcs,
            self.reward_weights,
            self.correctness,
            self.correct_threshold,
        )
        ids, attn, mask, sampling_logp = pad_rollouts(
            prompt_ids, generation, sampling.n, self.pad_token_id, self.mask_truncated
        )
        P, G = len(records), sampling.n
        num_tokens = sum(len(c) for c in generation.completion_ids)
        stats = {
            "tokens_per_s": num_tokens / max(gen_seconds, 1e-9),
            "generation_seconds": gen_seconds,
            "frac_truncated": 1.0 - sum(generation.finished) / max(len(generation.finished), 1),
        }
        for name, count in scored.num_failed.items():
            stats[f"failed_{name}"] = float(count)
        for name, values in scored.per_function.items():
            stats[f"reward_{name}"] = float(torch.nanmean(values.float())) if values.numel() else 0.0
        probe_rows = min(self.sync_probe_rows, len(generation.completion_ids))
        # Rows are prompt-major: row r is a completion of prompt r // n.
        self._probe = (
            [prompt_ids[r // sampling.n] for r in range(probe_rows)],
            [list(c) for c in generation.completion_ids[:probe_rows]],
        )
        return RolloutBatch(
            input_ids=ids,
            attention_mask=attn,
            completion_mask=mask,
            rewards=scored.rewards.view(P, G),
            correct=scored.correct.view(P, G),
            max_completion_length=sampling.max_tokens,
            sampling_logp=sampling_logp,
            prompts=prompts,
            completions=completions,
            stats=stats,
        )

    def _train_sampling(self, step: int) -> SamplingConfig:
        return replace(self.sampling, seed=self.seed + step)

    def _eval_sampling(self, batch_idx: int, offset: int) -> SamplingConfig:
        temperature = self.val_temperature or self.sampling.temperature
        return replace(
            self.sampling, n=self.val_samples, temperature=temperature, seed=self.seed + offset + 7919 * batch_idx
        )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._ensure_synced(trainer, pl_module, [record.prompt_ids for record in batch], evaluation=False)
        rollout = self.make_rollout(pl_module, batch, self._train_sampling(trainer.global_step))
        pl_module.receive_rollout(rollout)  # type: ignore[operator]
        self._sleep()  # the optimizer step needs the memory; the next push or generation wakes the engine
        every = self.log_samples_every
        if every and trainer.global_step % every == 0:
            self._log_samples(trainer, rollout)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Count optimizer steps since the last push: a training step may take several (mini-batches, mu > 1),
        # so global_step can jump over the multiples of sync_every.
        if trainer.global_step - self.last_sync_step >= self.sync_every:
            self._sync(trainer, pl_module)

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._ensure_synced(trainer, pl_module, [record.prompt_ids for record in batch], evaluation=True)
        pl_module.receive_rollout(self.make_rollout(pl_module, batch, self._eval_sampling(batch_idx, 1_000_003)))  # type: ignore[operator]

    def on_test_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._ensure_synced(trainer, pl_module, [record.prompt_ids for record in batch], evaluation=True)
        pl_module.receive_rollout(self.make_rollout(pl_module, batch, self._eval_sampling(batch_idx, 2_000_003)))  # type: ignore[operator]

    # ------------------------------------------------------------------ start / end of fit
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The engine was built in setup; a warm start (another callback's on_fit_start, in any order) or a
        # checkpoint restore (fit(ckpt_path=...), before or after this hook depending on the strategy) changes
        # the policy afterwards. Mark it stale; the first rollout pushes the weights then.
        self._engine_stale = True

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn != "fit":  # validate(ckpt_path=...) restores after setup built the engine
            self._engine_stale = True

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._engine_stale = True  # test(ckpt_path=...) restores after setup built the engine

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._engine_stale:
            # Push now rather than at the first batch so that the start-of-run validation samples from the
            # trained-from policy (warm-started or restored); probed on a validation prompt when there is one.
            self._ensure_synced(trainer, pl_module, self._first_prompts(trainer, "val"), evaluation=False)
        if self.validate_at_start and trainer.global_step == 0:
            self.start_pass_at_k = self.evaluate(trainer, pl_module)
            if trainer.logger is not None and self.start_pass_at_k:
                trainer.logger.log_metrics({f"val/{k}": v for k, v in self.start_pass_at_k.items()}, step=0)

    @staticmethod
    def _first_prompts(trainer: L.Trainer, split: str) -> list[list[int]]:
        """Token ids of the first few prompts of a split (for the sync probe), or [] when there are none."""
        datamodule: Any = getattr(trainer, "datamodule", None)
        splits = getattr(datamodule, "splits", None) or {}
        records = splits.get(split) or splits.get("train") or []
        return [record.prompt_ids for record in records[:2]]

    @torch.no_grad()
    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, split: str = "val") -> dict[str, float]:
        """pass@k on the datamodule's validation (or test) prompts, outside Lightning's loops."""
        datamodule = trainer.datamodule  # type: ignore[attr-defined]
        if datamodule is None:
            return {}
        loader = datamodule.val_dataloader() if split == "val" else datamodule.test_dataloader()
        metric = PassAtK(list(_as_any(pl_module).val_pass_at_k.ks))
        for batch_idx, records in enumerate(loader):
            rollout = self.make_rollout(pl_module, records, self._eval_sampling(batch_idx, 1_000_003))
            metric.update(rollout.correct)
        if float(metric.num_problems) == 0:
            return {}
        result = metric.compute()
        assert isinstance(result, dict)
        return {name: float(value) for name, value in result.items()}

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        after: dict[str, float] = getattr(pl_module, "last_val_pass_at_k", {})
        if not self.start_pass_at_k or not after or not trainer.is_global_zero:
            return
        lines = ["", "held-out pass@k        before RL    after RL"]
        for name in self.start_pass_at_k:
            lines.append(f"  {name:<20} {self.start_pass_at_k[name]:>9.3f}   {after.get(name, float('nan')):>9.3f}")
        print("\n".join(lines) + "\n")
        if trainer.logger is not None:
            final = {f"final/{k}": v for k, v in after.items()}
            final |= {f"final/start_{k}": v for k, v in self.start_pass_at_k.items()}
            trainer.logger.log_metrics(final, step=trainer.global_step)

    def _log_samples(self, trainer: L.Trainer, rollout: RolloutBatch) -> None:
        logger = trainer.logger
        experiment = getattr(logger, "experiment", None)
        run_id = getattr(logger, "run_id", None)
        if experiment is None or run_id is None or not hasattr(experiment, "log_table"):
            return
        rows = min(8, len(rollout.completions))
        table = {
            "step": [trainer.global_step] * rows,
            "prompt": rollout.prompts[:rows],
            "completion": rollout.completions[:rows],
            "reward": [float(x) for x in rollout.rewards.reshape(-1)[:rows]],
            "correct": [bool(x) for x in rollout.correct.reshape(-1)[:rows]],
        }
        try:
            experiment.log_table(run_id, data=table, artifact_file=f"samples/step_{trainer.global_step:06d}.json")
        except Exception as err:  # a logging hiccup must never stop training
            log.warning("could not log the sample table: %s", err)

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        return {"last_sync_step": self.last_sync_step, "start_pass_at_k": self.start_pass_at_k}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_sync_step = int(state_dict.get("last_sync_step", -1))
        self.start_pass_at_k = dict(state_dict.get("start_pass_at_k", {}))
        self._engine_stale = True  # the policy is being restored; the engine still holds the weights it was built from


__all__ = ["RolloutCallback", "WeightSyncError", "reward_name"]
