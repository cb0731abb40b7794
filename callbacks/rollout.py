"""``RolloutCallback``: owns the generation engine, keeps it in sync, and attaches rollouts to the batch.

Before every training batch it samples G completions per prompt (``sampling.n``) through a
:class:`~lit_fgrpo.rollout.collect.RolloutCollector` and attaches the scored
:class:`~lit_fgrpo.rollout.batch.RolloutBatch` to the :class:`~lit_fgrpo.rollout.batch.PromptBatch` that
``training_step`` receives (``batch.rollout``). After optimizer steps it pushes the policy's weights into the engine
(every ``sync_every`` steps) and checks the sync by comparing the engine's log-probs with the trainer's on a small
probe (logged as ``rollout/sync_logprob_delta``; a gap beyond ``sync_tolerance`` raises): the engine, its pushes and
the check are a :class:`~lit_fgrpo.rollout.engine_sync.EngineSync`. Validation and test batches get
``val_samples`` completions per prompt; the module logs ``val/pass_at_k``. Dynamic sampling's rounds are fed by
``callbacks/dynamic_rollouts.py``, asynchronous rollouts by ``callbacks/async_rollouts.py``.

Engine life cycle. The policy is built in the module's ``configure_model``, so the engine is built on the first
``fit``/``validate``/``test`` start hook that sees it. A warm start (another callback's ``on_fit_start``) or a
restored checkpoint (``fit(ckpt_path=...)``) changes the weights afterwards, so every stage marks the engine stale,
and the first rollout of the run pushes and checks the weights before it samples. With ``enable_sleep_mode`` on a
GPU the engine sleeps while the trainer runs its optimizer step and wakes before the next generation or push.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from typing import Any, Literal, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn
from typing_extensions import override

from lit_fgrpo.callbacks.async_rollouts import AsyncRolloutDriver, check_async_settings
from lit_fgrpo.callbacks.dynamic_rollouts import DYNAMIC_ROUND_SEED_OFFSET, PromptSource, dynamic_rollout, prompt_source
from lit_fgrpo.distributed import fail_together
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.metrics import PassAtK
from lit_fgrpo.module import FGRPOModule
from lit_fgrpo.progress import progress
from lit_fgrpo.rewards import resolve_reward
from lit_fgrpo.rewards.guarded_call import Isolation
from lit_fgrpo.rollout.async_rollouts import check_engine_for_async
from lit_fgrpo.rollout.base import RolloutEngine, SamplingConfig
from lit_fgrpo.rollout.batch import PromptBatch, RolloutBatch
from lit_fgrpo.rollout.collect import RolloutCollector, pad_id_of
from lit_fgrpo.rollout.dynamic_sampling import DynamicSampling
from lit_fgrpo.rollout.engine_sync import EngineSync
from lit_fgrpo.timing import PhaseTimer

log = logging.getLogger(__name__)

TRAIN_STREAM, VAL_STREAM, TEST_STREAM = 0, 1, 2
"""The ``stream`` argument of :func:`lit_fgrpo.distributed.prompt_seed` per split (their positions overlap)."""


@runtime_checkable
class RolloutConsumer(Protocol):
    """What the rollout callback needs from a LightningModule (checked once in ``setup``).

    ``policy`` is the causal LM the engine samples from (and receives weights from); ``tokenizer`` decodes
    completions for the reward functions. The module's ``training_step(batch)`` then reads ``batch.rollout`` of a
    :class:`~lit_fgrpo.rollout.batch.PromptBatch` (return ``as_prompt_batch(batch)`` from its
    ``on_after_batch_transfer``). :class:`~lit_fgrpo.module.FGRPOModule` is one.
    """

    @property
    def policy(self) -> nn.Module: ...

    @property
    def tokenizer(self) -> Any: ...


class RolloutCallback(L.Callback):
    """Build and sync the engine; attach scored rollouts to every train/validation/test batch.

    Args:
        engine: "hf" (the HF engine on the policy itself: its own sampling loop, or ``generate``), "hf_copy" (the
            same on the engine's own copy of the policy, for ``max_staleness > 0``), "vllm" (colocated vLLM), "vllm_server" (stock
            ``vllm serve`` processes, launched or given by URL: :mod:`lit_fgrpo.rollout.servers`), or
            "auto" (vLLM when installed and it pays off: on a GPU; on a CPU only for models the HF engine's loop
            cannot run, from 10M parameters; else HF; see
            :func:`lit_fgrpo.rollout.select.auto_engine_kind`).
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
        validate_at_start: sample the validation prompts once before the first RL step (logged at step 0 as
            ``val/pass_at_k``; :class:`~lit_fgrpo.callbacks.PassAtKReport` reports it beside the final values).
        log_samples_every: deprecated here; use :class:`~lit_fgrpo.callbacks.SampleTable`. Accepted so that old
            configs parse; a value > 0 warns.
        engine_kwargs: extra keyword arguments for the vLLM engine (gpu_memory_utilization, dtype,
            max_model_len, enable_sleep_mode, ...).
        hf_chunk_size: most rows per HF ``generate`` call.
        seed: base sampling seed; prompt p at step s samples with ``prompt_seed(seed, p.position, s, stream)``
            (stream 0 train, 1 validation, 2 test), so a resumed run repeats exactly and the completions a prompt
            gets do not depend on the number of ranks.
        reward_timeout: seconds one reward call may take; a call past it makes its rows unscorable (counted,
            logged as ``rollout/reward_timeouts``). None = no limit.
        reward_isolation: run timed reward calls in a ``thread`` (thread-safe functions) or a worker ``process``
            (functions that are not thread-safe, e.g. math-verify's signal-based timeout, or that may crash).
        dynamic_sampling: DAPO's dynamic sampling: draw prompts from the data module (a
            :class:`PromptSource`) in rounds until the step has P groups whose advantages are not all 0, at most
            ``max_rounds`` rounds (:mod:`lit_fgrpo.rollout.dynamic_sampling`); logged as ``rollout/dynamic_*``.
            Every drawn prompt is consumed. Several ranks draw in lockstep: the same rounds, each sized on the
            rank that misses the most groups (:class:`~lit_fgrpo.rollout.dynamic_sampling.Lockstep`).
        max_staleness: k; 0 = synchronous (generate, then train). k >= 1 generates up to k batches ahead of the
            trainer on the engine's own weight copy (vLLM or "hf_copy"); a rollout is at most k policy versions
            old (logged ``rollout/staleness_max``, ``rollout/dropped_stale``) and the module corrects for it with
            its importance weights (``--model.importance_correction``). See ``callbacks/async_rollouts.py``.
    """

    def __init__(
        self,
        engine: Literal["auto", "vllm", "hf", "hf_copy", "vllm_server"] = "hf",
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
        log_samples_every: int = 0,
        engine_kwargs: dict[str, Any] | None = None,
        hf_chunk_size: int = 512,
        seed: int = 0,
        reward_timeout: float | None = None,
        reward_isolation: Isolation = "thread",
        dynamic_sampling: DynamicSampling | None = None,
        max_staleness: int = 0,
    ) -> None:
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
        if reward_timeout is not None and not (0 < reward_timeout < float("inf")):
            raise ConfigError(
                f"RolloutCallback.reward_timeout must be a finite number > 0 or null, got {reward_timeout}"
            )
        if reward_isolation not in ("thread", "process"):
            raise ConfigError(
                f"RolloutCallback.reward_isolation must be 'thread' or 'process', got {reward_isolation!r}"
            )
        if engine not in ("auto", "vllm", "hf", "hf_copy", "vllm_server"):
            raise ValueError(
                f"RolloutCallback.engine must be 'auto', 'vllm', 'hf', 'hf_copy' or 'vllm_server', got {engine!r}"
            )
        names = reward_funcs or ["maze"]
        self._reward_funcs = [resolve_reward(name) for name in names]
        if reward_weights is not None and len(reward_weights) != len(names):
            raise ValueError(
                f"RolloutCallback.reward_weights has {len(reward_weights)} values for {len(names)} reward_funcs"
            )
        if log_samples_every > 0:
            log.warning("RolloutCallback.log_samples_every is ignored: add lit_fgrpo.callbacks.SampleTable instead")
        self._reward_weights = reward_weights
        self._correctness = resolve_reward(correctness) if correctness else self._reward_funcs[0]
        self._correct_threshold = correct_threshold
        self._val_samples = val_samples
        self._val_temperature = val_temperature
        self._sync_every = sync_every
        self._mask_truncated = mask_truncated_completions
        self._validate_at_start = validate_at_start
        self._seed = seed
        self._reward_timeout = reward_timeout
        self._reward_isolation: Isolation = reward_isolation
        self.dynamic_sampling = dynamic_sampling
        self.engine_sync = EngineSync(engine, engine_kwargs or {}, hf_chunk_size, sync_tolerance, sync_probe_rows)
        """The engine, its weight pushes and their check (built at the first stage start that sees the policy)."""
        self.collector: RolloutCollector | None = None
        self._consumer: RolloutConsumer | None = None
        # The module's step timer (generate, reward and sync are timed here, logged by the module with its
        # own phases); a private one, never logged, for other consumers.
        self._timer = PhaseTimer()
        self.start_pass_at_k: dict[str, float] = {}
        # ---- asynchronous rollouts (issue 11): None at max_staleness=0, the synchronous path ----
        check_async_settings(max_staleness, sync_every, None)
        self.max_staleness = max_staleness
        self._trainer: L.Trainer | None = None
        self.async_rollouts: AsyncRolloutDriver | None = None
        if max_staleness > 0 and dynamic_sampling is not None:
            raise ConfigError(
                f"RolloutCallback.dynamic_sampling with max_staleness={max_staleness}: dynamic sampling draws its "
                "prompts in rounds that depend on the rewards, which the generator cannot sample ahead; drop one"
            )
        if max_staleness > 0:
            self.async_rollouts = AsyncRolloutDriver(max_staleness, self._collect_ahead, self._push_from_runner)

    # ------------------------------------------------------------------ engine
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # FGRPOModule is checked by type: a Protocol check would touch `policy` and build it before configure_model.
        if not isinstance(pl_module, FGRPOModule | RolloutConsumer):
            raise TypeError(
                f"RolloutCallback needs a module with `policy` and `tokenizer` (lit_fgrpo.callbacks.RolloutConsumer); "
                f"{type(pl_module).__name__} has not"
            )
        self._consumer = pl_module
        if isinstance(pl_module, FGRPOModule):
            self._timer = pl_module.timer
        if isinstance(pl_module, FGRPOModule):
            check_async_settings(self.max_staleness, self._sync_every, pl_module.hp.importance_correction)
        ks = pl_module.pass_at_k.ks if isinstance(pl_module, FGRPOModule) else [1]
        if self._val_samples < max(ks):
            raise ValueError(
                f"RolloutCallback.val_samples={self._val_samples} is fewer than the largest pass@k k={max(ks)} "
                "(--model.val_pass_at_k); unbiased pass@k needs n >= k"
            )
        if isinstance(pl_module, FGRPOModule) and float(pl_module.hp.temperature) != self.sampling.temperature:
            # The engine reports log_softmax(z / sampling.temperature); the module divides its logits by its own
            # temperature. Different values make the importance weights and logprob_mismatch meaningless.
            log.warning(
                "RolloutCallback.sampling.temperature=%s differs from the module's temperature=%s: the sampling "
                "log-probs and the trainer's log-probs are then at different temperatures",
                self.sampling.temperature,
                pl_module.hp.temperature,
            )

    @property
    def engine(self) -> RolloutEngine | None:
        """The generation engine (None before the first stage start and after teardown)."""
        return self.engine_sync.engine

    @property
    def last_sync_step(self) -> int:
        """The global step of the last weight push (-1: none yet)."""
        return self.engine_sync.last_sync_step

    def _build_engine(self) -> RolloutCollector:
        """The engine and its collector, built once from the (now configured) policy."""
        assert self._consumer is not None, "RolloutCallback.setup has not run"
        engine = self.engine_sync.build(self._consumer.policy, self._consumer.tokenizer)
        if self.collector is None:
            tokenizer = self._consumer.tokenizer
            self.collector = RolloutCollector(
                engine,
                tokenizer,
                self._reward_funcs,
                self._reward_weights,
                self._correctness,
                self._correct_threshold,
                pad_id_of(tokenizer),
                self._mask_truncated,
                reward_timeout=self._reward_timeout,
                reward_isolation=self._reward_isolation,
            )
        return self.collector

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.async_rollouts is not None:
            self.async_rollouts.close()  # stop generating before the engine goes
        self.engine_sync.close()
        self.collector = None

    def _sync(self, trainer: L.Trainer) -> None:
        """Push the policy's weights into the engine and check them; the metrics go to the logger at this step."""
        self._build_engine()
        assert self._consumer is not None
        metrics = self.engine_sync.push(self._consumer.policy, self._consumer.tokenizer, trainer.global_step)
        if trainer.logger is not None:
            trainer.logger.log_metrics(metrics, step=trainer.global_step)

    def _ensure_synced(self, trainer: L.Trainer, prompt_ids: list[list[int]], evaluation: bool) -> None:
        """Push the weights before sampling when the engine may be behind the policy (stale, or for evaluation
        during fit, optimizer steps since the last push); ``prompt_ids`` give a probe when no rollout has yet."""
        if self.engine_sync.needs_push(trainer.global_step, evaluation and trainer.state.fn == "fit"):
            self.engine_sync.probe_from_prompts(prompt_ids)
            self._sync(trainer)

    # ------------------------------------------------------------------ rollouts
    def collect(self, batch: PromptBatch, sampling: SamplingConfig, step: int = 0, stream: int = 0) -> RolloutBatch:
        """Sample and score one batch through the collector; remembers a few rows as the next sync probe.

        ``step`` and ``stream`` seed each prompt (see :meth:`lit_fgrpo.rollout.collect.RolloutCollector.collect`).
        """
        rollout = self._build_engine().collect(batch.records, sampling, step=step, stream=stream)
        self.engine_sync.remember_probe(rollout.prompt_ids, rollout.completion_ids, rollout.group_size)
        return rollout

    def train_sampling(self) -> SamplingConfig:
        """Sampling of training rollouts, with the base seed (each prompt's seed adds its position and the step)."""
        return replace(self.sampling, seed=self._seed)

    def eval_sampling(self) -> SamplingConfig:
        """Sampling of evaluation batches: ``val_samples`` per prompt, the validation temperature, the base seed."""
        temperature = self._val_temperature or self.sampling.temperature
        return replace(self.sampling, n=self._val_samples, temperature=temperature, seed=self._seed)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        assert isinstance(batch, PromptBatch), "the module's on_after_batch_transfer must return a PromptBatch"
        if self.async_rollouts is not None:
            with self.async_rollouts.paused(), self._timer.phase("sync"):
                self._ensure_synced(trainer, batch.prompt_ids, evaluation=False)
            with self._timer.phase("wait"):  # the trainer waiting on the generator thread
                taken = self.async_rollouts.take(trainer, batch)
            batch.rollout = taken.batch
            pl_module.log_dict(taken.stats, on_step=True, on_epoch=False, batch_size=len(batch.records))
            return
        with self._timer.phase("sync"):
            self._ensure_synced(trainer, batch.prompt_ids, evaluation=False)
        start = time.perf_counter()
        if self.dynamic_sampling is None:
            step = trainer.global_step
            # Every rank runs the same training batches: a rollout that raises on one rank stops them all.
            with fail_together(f"the rollout at step {step}"):
                batch.rollout = rollout = self.collect(batch, self.train_sampling(), step, TRAIN_STREAM)
        else:
            batch.rollout = rollout = self._dynamic_rollout(trainer, pl_module, len(batch.records))
        # The collector times generation itself; the rest of collecting (decoding, rewards, packing) is "reward".
        generate = rollout.stats.get("generation_seconds", 0.0)
        self._timer.add("generate", generate)
        self._timer.add("reward", time.perf_counter() - start - generate)
        self._timer.add_tokens("generate", sum(len(ids) for ids in rollout.completion_ids))
        assert self.engine is not None
        self.engine.sleep()  # the optimizer step needs the memory; the next push or generation wakes the engine

    def _dynamic_rollout(self, trainer: L.Trainer, pl_module: L.LightningModule, num_prompts: int) -> RolloutBatch:
        """P informative groups drawn in rounds from the data module (the loader's batch only paces the step)."""
        assert self.dynamic_sampling is not None and self.collector is not None
        sampling = self.train_sampling()

        def collect(records: list[Any], seed_step: int) -> RolloutBatch:
            return self.collect(PromptBatch(records), sampling, seed_step, TRAIN_STREAM)

        weight = pl_module.applied_group_weight if isinstance(pl_module, FGRPOModule) else None
        return dynamic_rollout(
            collect,
            prompt_source(trainer),
            num_prompts,
            self.dynamic_sampling,
            weight,
            self.collector.pad_token_id,
            trainer.global_step,
            trainer.world_size,
        )

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Count optimizer steps since the last push: a training step may take several (mini-batches, mu > 1),
        # so global_step can jump over the multiples of sync_every.
        if self.async_rollouts is not None:
            with self._timer.phase("sync"):
                self.async_rollouts.push()  # version = RL steps done; waits for the generator's claims
            return
        if trainer.global_step - self.last_sync_step >= self._sync_every:
            with self._timer.phase("sync"):  # logged on this step by the module's on_train_batch_end
                self._sync(trainer)

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        assert isinstance(batch, PromptBatch), "the module's on_after_batch_transfer must return a PromptBatch"
        with self._engine_turn():
            self._ensure_synced(trainer, batch.prompt_ids, evaluation=True)
            batch.rollout = self.collect(batch, self.eval_sampling(), trainer.global_step, VAL_STREAM)

    @override
    def on_test_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        assert isinstance(batch, PromptBatch), "the module's on_after_batch_transfer must return a PromptBatch"
        with self._engine_turn():
            self._ensure_synced(trainer, batch.prompt_ids, evaluation=True)
            batch.rollout = self.collect(batch, self.eval_sampling(), trainer.global_step, TEST_STREAM)

    # ------------------------------------------------------------------ start of a stage
    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A warm start (another callback's on_fit_start, in any order) or a checkpoint restore changes the policy
        # after the engine is built. Mark it stale; the first rollout pushes the weights then.
        self._build_engine()
        self.engine_sync.stale = True
        if self.dynamic_sampling is not None:
            prompt_source(trainer)  # refuse a data module without draw_prompts before any work
        if self.async_rollouts is not None:
            assert self.engine is not None
            check_engine_for_async(self.engine, self.max_staleness)
            self._trainer = trainer

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._build_engine()
        if trainer.state.fn != "fit":  # validate(ckpt_path=...) restores after setup
            self.engine_sync.stale = True

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._build_engine()
        self.engine_sync.stale = True  # test(ckpt_path=...) restores after setup

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        val_prompts = [record.prompt_ids for record in self._eval_records(trainer)[:2]]
        if self.engine_sync.stale:
            # Push now rather than at the first batch so that the start-of-run validation samples from the
            # trained-from policy (warm-started or restored); probed on a validation prompt when there is one.
            self._ensure_synced(trainer, val_prompts, evaluation=False)
        if self._validate_at_start and trainer.global_step == 0:
            self.start_pass_at_k = self.evaluate(trainer)
            if trainer.logger is not None and self.start_pass_at_k:
                trainer.logger.log_metrics({f"val/{k}": v for k, v in self.start_pass_at_k.items()}, step=0)

    @staticmethod
    def _val_batches(trainer: L.Trainer) -> list[Any]:
        """The data module's validation batches (lists of records), or [] without a data module.

        Read from ``val_dataloader()`` directly: at ``on_train_start`` Lightning has not built its own yet.
        """
        # Lightning sets `trainer.datamodule` at fit time without declaring it on the class.
        datamodule: L.LightningDataModule | None = getattr(trainer, "datamodule", None)
        if datamodule is None or not is_overridden("val_dataloader", datamodule):
            return []
        return list(datamodule.val_dataloader())

    def _eval_records(self, trainer: L.Trainer) -> list[Any]:
        """The first validation batch's records (for the sync probe), or [] when there is none."""
        batches = self._val_batches(trainer)
        return list(batches[0]) if batches else []

    @torch.no_grad()
    def evaluate(self, trainer: L.Trainer) -> dict[str, float]:
        """pass@k on the data module's validation prompts with the validation sampling (the start-of-run value)."""
        assert self._consumer is not None
        ks = self._consumer.pass_at_k.ks if isinstance(self._consumer, FGRPOModule) else [1]
        metric = PassAtK(list(ks))
        batches = self._val_batches(trainer)
        # minutes on a real validation set: a bar on a terminal, status lines in a log (lit_fgrpo.progress)
        with progress("pass@k before RL", total=len(batches), unit="batch") as bar:
            for records in batches:
                sampling = self.eval_sampling()
                rollout = self.collect(PromptBatch(list(records)), sampling, trainer.global_step, VAL_STREAM)
                metric.update(rollout.correct)
                bar.update(1)
        if float(metric.num_problems) == 0:
            return {}
        result = metric.compute()
        assert isinstance(result, dict)
        return {name: float(value) for name, value in result.items()}

    # ------------------------------------------------------------------ asynchronous rollouts (issue 11)
    def _collect_ahead(self, records: Any, step: int) -> RolloutBatch:
        """The runner's sampling of training batch ``step`` (generator thread): seeded as the synchronous step."""
        return self.collect(PromptBatch(list(records)), self.train_sampling(), step, TRAIN_STREAM)

    def _push_from_runner(self) -> None:
        """The runner's weight push (trainer thread, generator paused): sync and check, as the synchronous loop."""
        assert self._trainer is not None
        self._sync(self._trainer)

    def _engine_turn(self) -> Any:
        """Exclusive use of the engine while the generator is paused (a no-op when synchronous)."""
        return self.async_rollouts.paused() if self.async_rollouts is not None else contextlib.nullcontext()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self.async_rollouts is not None:
            self.async_rollouts.close()

    # ------------------------------------------------------------------ checkpoint state
    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "last_sync_step": self.last_sync_step,
            "start_pass_at_k": self.start_pass_at_k,
            "group_size": self.sampling.n,
        }
        if self.async_rollouts is not None:
            state["async_rollouts"] = self.async_rollouts.state_dict()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_n = state_dict.get("group_size")
        if saved_n is not None and int(saved_n) != self.sampling.n:
            log.warning(
                "resuming with RolloutCallback.sampling.n=%d (group size G) but the checkpoint was trained with %d: "
                "the config's value %d wins from here on",
                self.sampling.n,
                int(saved_n),
                self.sampling.n,
            )
        self.engine_sync.last_sync_step = int(state_dict.get("last_sync_step", -1))
        self.start_pass_at_k = dict(state_dict.get("start_pass_at_k", {}))
        self.engine_sync.stale = True  # the policy is being restored; the engine holds the weights it was built from
        if self.async_rollouts is not None and "async_rollouts" in state_dict:
            self.async_rollouts.load_state_dict(state_dict["async_rollouts"])


__all__ = [
    "DYNAMIC_ROUND_SEED_OFFSET",
    "TEST_STREAM",
    "TRAIN_STREAM",
    "VAL_STREAM",
    "PromptSource",
    "RolloutCallback",
    "RolloutConsumer",
]
