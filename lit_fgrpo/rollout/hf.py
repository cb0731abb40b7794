"""Rollouts with the trainer's own policy module through Hugging Face ``generate``.

No second copy of the weights exists, so :meth:`HFEngine.sync_weights` is a no-op and the sampling
log-probs are those of the trainer's policy (up to batching noise):

.. math::
    ℓp[b, t] = \\log\\operatorname{softmax}(z_{b,t} / τ)[y_{b,t}]

where ``z`` are the raw logits (before top-k / top-p filtering, which shape the sampler but are not the
policy), ``τ`` the sampling temperature and ``y`` the sampled token.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lit_fgrpo.rollout.base import Generation, RolloutEngine, SamplingConfig
from lit_fgrpo.rollout.scoring import eval_mode, policy_logprobs


def _cut_at_stop(tokens: list[int], stop_ids: set[int]) -> tuple[int, bool]:
    """Length up to and including the first stop token, and whether one was found."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return i + 1, True
    return len(tokens), False


class HFEngine(RolloutEngine):
    """A :class:`~lit_fgrpo.rollout.base.RolloutEngine` that samples with ``model.generate``.

    Args:
        model: the policy (a ``PreTrainedModel`` or a PEFT wrapper); shared with the trainer.
        pad_token_id: id used for left-padding prompts and right-padding finished rows.
        eos_token_id: always a stop token, in addition to ``SamplingConfig.stop_token_ids``.
        chunk_size: most rows (prompts x samples) sent to one ``generate`` / forward call.
    """

    def __init__(self, model: nn.Module, pad_token_id: int, eos_token_id: int, chunk_size: int = 512) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.eos_token_id = int(eos_token_id)
        self.chunk_size = int(chunk_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def sync_weights(self, model: nn.Module) -> None:
        """No-op: the engine samples with the trainer's module itself (a different module is adopted)."""
        if model is not self.model:
            self.model = model

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad token lists into ``input_ids`` and ``attention_mask``, both (R, L)."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)  # (R, L)
        attn = torch.zeros((len(rows), width), dtype=torch.long)  # (R, L)
        for i, r in enumerate(rows):
            if r:
                ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
                attn[i, width - len(r) :] = 1
        return ids.to(self.device), attn.to(self.device)

    def _generation_config(self, sampling: SamplingConfig, stop_ids: list[int]) -> Any:
        from transformers import GenerationConfig

        return GenerationConfig(
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            max_new_tokens=sampling.max_tokens,
            min_new_tokens=0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            typical_p=1.0,
            num_return_sequences=1,
            eos_token_id=stop_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            return_dict_in_generate=True,
            output_logits=True,
        )

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Generation:
        """Sample ``sampling.n`` completions per prompt; rows are prompt-major (row ``i * n + j``).

        Rows are expanded to ``P * n`` left-padded copies and sent in chunks of at most ``chunk_size``
        rows (equivalent to ``num_return_sequences=n``, which expands the same way internally). Under a
        fixed ``sampling.seed`` the result is deterministic and the global RNG is left untouched.
        """
        if not prompt_ids:
            return Generation(completion_ids=[], sampling_logprobs=[], finished=[])
        stop_list = [self.eos_token_id] + [int(s) for s in sampling.stop_token_ids if int(s) != self.eos_token_id]
        stop_set = set(stop_list)
        gen_cfg = self._generation_config(sampling, stop_list)
        rows = [p for p in prompt_ids for _ in range(sampling.n)]  # B = P * n, prompt-major

        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        finished: list[bool] = []
        devices = [self.device] if self.device.type == "cuda" else []
        with eval_mode(self.model), torch.random.fork_rng(devices=devices, enabled=sampling.seed is not None):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(rows), self.chunk_size):
                chunk = rows[start : start + self.chunk_size]
                input_ids, attn = self._left_pad(chunk)  # (R, L)
                out = self.model.generate(input_ids=input_ids, attention_mask=attn, generation_config=gen_cfg)  # type: ignore[operator]
                new = out.sequences[:, input_ids.shape[1] :]  # (R, T_new)
                logits = torch.stack(out.logits, dim=1).float()  # (R, T_new, V)
                logp = torch.log_softmax(logits / sampling.temperature, dim=-1)  # (R, T_new, V)
                tok_logp = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1).cpu()  # (R, T_new)
                new_cpu = new.cpu()
                for r in range(new_cpu.shape[0]):
                    toks = new_cpu[r].tolist()
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
