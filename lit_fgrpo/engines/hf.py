"""Rollouts with the trainer's own policy module: its own sampling loop, or Hugging Face ``generate``.

No second copy of the weights exists, so :meth:`HFEngine.sync_weights` is a no-op and the sampling
log-probs are those of the trainer's policy (up to batching noise):

.. math::
    ℓp[b, t] = \\log\\operatorname{softmax}(z_{b,t} / τ)[y_{b,t}]

where ``z`` are the raw logits (before top-k / top-p filtering, which shape the sampler but are not the
policy), ``τ`` the sampling temperature and ``y`` the sampled token.

Per-prompt seeds. HF sampling draws from one global generator for the whole batch, so what a prompt gets would
depend on which prompts share its call. Instead every row samples from a counter-based generator keyed by its own
seed (:class:`~lit_fgrpo.engines.row_sampling.RowSampler`: one uniform number per row and step, inverse-CDF
sampling of the tempered, top-k/top-p filtered distribution). Row ``j`` of prompt ``i`` has the seed
``prompt_seed(seeds[i], j, 0)``, so its tokens depend only on ``seeds[i]`` and the weights, never on the batch.
The engine's loop (:func:`~lit_fgrpo.engines.decode.sample_rows`: one prefill per prompt, a preallocated KV
cache, finished rows dropped) draws with it directly; on ``generate`` (models with sliding-window or hybrid caches,
or ``own_loop=False``) the sampler is a logits processor and greedy decoding picks its token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lit_fgrpo.distributed.rank_layout import SEED_BITS, prompt_seed
from lit_fgrpo.engines.base import Generation, RolloutEngine, SamplingConfig
from lit_fgrpo.engines.decode import left_pad, sample_rows, supports_own_loop
from lit_fgrpo.engines.prepared_weights import DecodeDtype, PreparedWeights, resolve_decode_dtype
from lit_fgrpo.engines.row_sampling import RowSampler
from lit_fgrpo.engines.threads import Threads, check_threads, generation_threads
from lit_fgrpo.engines.trainer_logprobs import policy_logprobs
from lit_fgrpo.models.logprobs import eval_mode


def _cut_at_stop(tokens: list[int], stop_ids: set[int]) -> tuple[int, bool]:
    """Length up to and including the first stop token, and whether one was found."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return i + 1, True
    return len(tokens), False


def prompt_seeds(sampling: SamplingConfig, num_prompts: int, seeds: Sequence[int] | None) -> list[int]:
    """The per-prompt seeds: ``seeds`` as given, else ``sampling.seed + i * n`` (vLLM's convention), else drawn
    from torch's global generator (an unseeded run stays reproducible under ``seed_everything``)."""
    if seeds is not None:
        if len(seeds) != num_prompts:
            raise ValueError(f"generate: {len(seeds)} seeds for {num_prompts} prompts")
        return [int(s) for s in seeds]
    if sampling.seed is not None:
        return [sampling.seed + i * sampling.n for i in range(num_prompts)]
    return torch.randint(0, 2**SEED_BITS - 1, (num_prompts,)).tolist()


class HFEngine(RolloutEngine):
    """A :class:`~lit_fgrpo.engines.base.RolloutEngine` that samples with ``model.generate``.

    Args:
        model: the policy (a ``PreTrainedModel`` or a PEFT wrapper); shared with the trainer.
        pad_token_id: id used for left-padding prompts and right-padding finished rows.
        eos_token_id: always a stop token, in addition to ``SamplingConfig.stop_token_ids``.
        chunk_size: most rows (prompts x samples) sent to one ``generate`` / forward call.
        own_loop: sample with :func:`~lit_fgrpo.engines.decode.sample_rows` (one prefill per prompt, a
            preallocated KV cache, finished rows dropped) where the model allows it (a plain full-attention cache);
            False always uses ``model.generate``. Both give a row the same tokens up to float rounding.
        lean: in the own loop, decode Llama / Qwen2 / Qwen3 models with the lean step
            (:mod:`~lit_fgrpo.engines.lean_step`: each prompt's keys and values shared by its rows, no head copies)
            instead of the model's forward; the same tokens up to float rounding.
        threads: torch threads while generating, the trainer's count restored after: None keeps torch's count
            (by default every core), ``"auto"`` takes the cores no other process keeps busy
            (:func:`~lit_fgrpo.engines.threads.free_cores`).
        decode_dtype: the dtype of the lean step's projections: ``"float32"`` (the model's own), ``"bfloat16"``
            (activations, attention and LoRA stay float32: :mod:`~lit_fgrpo.engines.prepared_weights`), or
            ``"auto"`` (bfloat16 where the device multiplies it natively). Models off the lean step decode in their own
            dtype.
        pack_weights: multiply frozen weights (LoRA's base) by oneDNN-packed copies, made once: the same numbers
            as ``F.linear`` up to float rounding, faster, at the memory of the copies.
    """

    has_own_weights = False  # it samples with the trainer's policy module itself

    def __init__(
        self,
        model: nn.Module,
        pad_token_id: int,
        eos_token_id: int,
        chunk_size: int = 512,
        own_loop: bool = True,
        lean: bool = True,
        threads: Threads = None,
        decode_dtype: DecodeDtype = "float32",
        pack_weights: bool = True,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        check_threads(threads, "threads")
        resolve_decode_dtype(decode_dtype, torch.device("cpu"), "decode_dtype")  # a bad value fails here
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.eos_token_id = int(eos_token_id)
        self.chunk_size = int(chunk_size)
        self.own_loop = bool(own_loop)
        self.lean = bool(lean)
        self.threads = threads
        self.decode_dtype = decode_dtype
        self.pack_weights = bool(pack_weights)
        self._prepared: PreparedWeights | None = None

    def prepared_weights(self) -> PreparedWeights | None:
        """The lean step's prepared weight copies (kept across calls while their weights are unchanged), or None
        when the step uses the weights as they are (float32 without packing, or a device other than the CPU)."""
        dtype = resolve_decode_dtype(self.decode_dtype, self.device, "decode_dtype")
        pack = self.pack_weights and self.device.type == "cpu"
        if dtype is None and not pack:
            return None
        if self._prepared is None or self._prepared.dtype != dtype or self._prepared.pack != pack:
            self._prepared = PreparedWeights(dtype, pack)
        return self._prepared

    def sleep(self) -> None:
        """Before the optimizer step: drop the prepared copies of the weights it changes (frozen ones stay)."""
        if self._prepared is not None:
            self._prepared.release_trainable()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def sync_weights(self, model: nn.Module) -> None:
        """No-op: the engine samples with the trainer's module itself (a different module is adopted)."""
        if model is not self.model:
            self.model = model
            self._prepared = None

    def _generation_config(self, sampling: SamplingConfig, stop_ids: list[int]) -> Any:
        from transformers import GenerationConfig

        # Greedy over the RowSampler's scores: the sampling itself (temperature, top-k, top-p) happens there.
        return GenerationConfig(
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            max_new_tokens=sampling.max_tokens,
            min_new_tokens=0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            num_return_sequences=1,
            eos_token_id=stop_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            return_dict_in_generate=True,
        )

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingConfig, seeds: Sequence[int] | None = None
    ) -> Generation:
        """Sample ``sampling.n`` completions per prompt; rows are prompt-major (row ``i * n + j``).

        Rows go in chunks of at most ``chunk_size``: through the engine's own loop (each prompt prefilled once for
        its rows) where the model allows it, else as ``P * n`` left-padded copies through ``generate``.
        Row ``j`` of prompt ``i`` samples from its own counter-based generator keyed ``prompt_seed(seeds[i], j, 0)``,
        so prompt ``i``'s completions depend only on ``seeds[i]`` and the weights (up to float noise of batching), not on the
        other prompts of the call. The global RNG is left untouched when a seed is given.

        Args:
            prompt_ids: P prompts (token ids, no padding).
            sampling: sampling settings.
            seeds: one seed per prompt; ``None`` derives them from ``sampling.seed`` (see :func:`prompt_seeds`).
        """
        if not prompt_ids:
            return Generation(completion_ids=[], sampling_logprobs=[], finished=[])
        stop_list = [self.eos_token_id] + [int(s) for s in sampling.stop_token_ids if int(s) != self.eos_token_id]
        stop_set = set(stop_list)
        gen_cfg = self._generation_config(sampling, stop_list)
        per_prompt = prompt_seeds(sampling, len(prompt_ids), seeds)
        rows = [p for p in prompt_ids for _ in range(sampling.n)]  # B = P * n, prompt-major
        row_seeds = [prompt_seed(s, j, 0) for s in per_prompt for j in range(sampling.n)]  # (B,)

        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        finished: list[bool] = []
        own_loop = self.own_loop and supports_own_loop(self.model) and all(prompt_ids)
        prepared = self.prepared_weights() if own_loop and self.lean else None
        with eval_mode(self.model), generation_threads(self.threads):
            for start in range(0, len(rows), self.chunk_size):
                end = min(start + self.chunk_size, len(rows))
                sampler = RowSampler(row_seeds[start:end], sampling, self.device)
                if own_loop:
                    # rows are prompt-major: the chunk's distinct prompts are prefilled once each
                    first, last = start // sampling.n, (end - 1) // sampling.n
                    row_prompt = [r // sampling.n - first for r in range(start, end)]
                    out = sample_rows(
                        self.model, prompt_ids[first : last + 1], row_prompt, sampler, sampling.max_tokens, stop_set,
                        self.pad_token_id, self.lean, prepared,
                    )  # fmt: skip
                    completions += out.tokens
                    logprobs += out.logprobs
                    finished += out.finished
                    continue
                input_ids, attn = left_pad(rows[start:end], self.pad_token_id, self.device)  # (R, L)
                gen_out = self.model.generate(  # type: ignore[operator]
                    input_ids=input_ids, attention_mask=attn, generation_config=gen_cfg, logits_processor=[sampler]
                )
                new = gen_out.sequences[:, input_ids.shape[1] :].cpu()  # (R, T_new)
                tok_logp = torch.stack(sampler.step_logprobs, dim=1).cpu()  # (R, T_new)
                for r in range(new.shape[0]):
                    toks = new[r].tolist()
                    length, done = _cut_at_stop(toks, stop_set)
                    completions.append(toks[:length])
                    logprobs.append(tok_logp[r, :length].tolist())
                    finished.append(done)
        return Generation(completion_ids=completions, sampling_logprobs=logprobs, finished=finished)

    def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0
    ) -> list[torch.Tensor]:
        """Teacher-forced log-probs ``log_softmax(z / τ)`` of each completion given its prompt.

        Returns:
            One float32 CPU tensor of shape (T_i,) per row.
        """
        return policy_logprobs(
            self.model, prompt_ids, completion_ids, self.pad_token_id, temperature, chunk_rows=self.chunk_size
        )
