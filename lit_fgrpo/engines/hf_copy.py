"""``HFCopyEngine``: the HF engine on a private copy of the policy, so that generation can overlap training.

:class:`~lit_fgrpo.engines.hf.HFEngine` samples with the trainer's module itself, which is right for the
synchronous loop and wrong for asynchronous rollouts (the optimizer would change the weights mid-generation).
This engine deep-copies the policy once (frozen, eval mode) and :meth:`sync_weights` copies the trainer's tensors
into it in place, so the engine holds exactly the weights of the last push until the next one.

Seeded generation draws every row from its own counter-based stream (``RowSampler``, see
:mod:`lit_fgrpo.engines.hf`), never from torch's global RNG, so a generator thread and the trainer thread cannot
disturb each other's random numbers.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from lit_fgrpo.engines.base import Generation, RolloutEngine, SamplingConfig
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.engines.prepared_weights import DecodeDtype, PreparedWeights


class HFCopyEngine(RolloutEngine):
    """A :class:`~lit_fgrpo.engines.base.RolloutEngine` with its own copy of the weights.

    Args:
        model: the trainer's policy (a ``PreTrainedModel`` or a PEFT wrapper); copied, never modified.
        pad_token_id: id used for left-padding prompts.
        eos_token_id: always a stop token.
        chunk_size: most rows per ``generate`` / forward call.
        decode_dtype: the decoding matmuls' dtype (:class:`~lit_fgrpo.engines.hf.HFEngine`).
    """

    has_own_weights = True  # the copy changes only when sync_weights copies the trainer's weights in

    def __init__(
        self,
        model: nn.Module,
        pad_token_id: int,
        eos_token_id: int,
        chunk_size: int = 512,
        decode_dtype: DecodeDtype = "float32",
    ) -> None:
        copied = copy.deepcopy(model).eval()
        copied.requires_grad_(False)
        self._inner = HFEngine(
            copied, pad_token_id, eos_token_id, chunk_size, decode_dtype=decode_dtype, pack_weights=False
        )

    def prepared_weights(self) -> PreparedWeights | None:
        """The inner engine's prepared weight copies (:meth:`lit_fgrpo.engines.hf.HFEngine.prepared_weights`)."""
        return self._inner.prepared_weights()

    @property
    def model(self) -> nn.Module:
        """The engine's own copy of the policy."""
        return self._inner.model

    @torch.no_grad()
    def sync_weights(self, model: nn.Module) -> None:
        """Copy the trainer's parameters and buffers into the engine's copy (in place, same structure).

        Raises:
            ValueError: when ``model`` does not have the structure of the copied policy.
        """
        target = self._inner.model.state_dict()
        source = model.state_dict()
        if source.keys() != target.keys():
            missing = sorted(set(target) - set(source))[:3]
            extra = sorted(set(source) - set(target))[:3]
            raise ValueError(
                f"HFCopyEngine.sync_weights: model has another structure (missing {missing}, extra {extra})"
            )
        for name, tensor in target.items():
            tensor.copy_(source[name])

    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingConfig, seeds: Sequence[int] | None = None
    ) -> Generation:
        """Sample with the copied weights; see :meth:`lit_fgrpo.engines.hf.HFEngine.generate`."""
        return self._inner.generate(prompt_ids, sampling, seeds)

    def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0
    ) -> list[torch.Tensor]:
        """Teacher-forced ``log_softmax(z / temperature)`` under the copied weights, one (T_i,) per row."""
        return self._inner.score(prompt_ids, completion_ids, temperature)
