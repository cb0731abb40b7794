"""``GatheredHFEngine``: the colocated HF engine of a sharded (FSDP2) policy, on a whole copy of its weights.

A sharded policy cannot sample on one rank alone (each of its forwards all-gathers with the other ranks), so
:func:`~lit_fgrpo.rollout.engine_select.build_engine` gives a sharded policy this engine for ``hf`` and ``hf_copy``. It holds
an unsharded copy (the engine's memory, as vLLM holds its own weights) and :meth:`sync_weights` streams the full
weights into it one tensor at a time (:func:`~lit_fgrpo.distributed.full_copy.load_full_weights`): every rank
gathers each tensor, copies it into its copy and drops it before the next, so no rank holds a second full copy.

Every rank must push at the same time (the rollout callback pushes on every rank at the same steps).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lit_fgrpo.distributed.full_copy import load_full_weights, unsharded_copy
from lit_fgrpo.engines.base import Generation, RolloutEngine, SamplingConfig
from lit_fgrpo.engines.hf import HFEngine
from lit_fgrpo.engines.prepared_weights import DecodeDtype, PreparedWeights


class GatheredHFEngine(RolloutEngine):
    """A :class:`~lit_fgrpo.engines.base.RolloutEngine` on an unsharded copy of a sharded policy.

    Args:
        model: the trainer's sharded policy (plain or PEFT); its weights reach the copy at :meth:`sync_weights`.
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
        self._inner = HFEngine(
            unsharded_copy(model),
            pad_token_id,
            eos_token_id,
            chunk_size,
            decode_dtype=decode_dtype,
            pack_weights=False,  # the copy changes at every push: a reorder per push would cost more than it saves
        )
        self.num_pushed = 0
        """Tensors copied in by the last push (every weight of the policy, LoRA merged)."""

    def prepared_weights(self) -> PreparedWeights | None:
        """The inner engine's prepared weight copies (:meth:`lit_fgrpo.engines.hf.HFEngine.prepared_weights`)."""
        return self._inner.prepared_weights()

    @property
    def model(self) -> nn.Module:
        """The engine's own, unsharded copy."""
        return self._inner.model

    def sync_weights(self, model: nn.Module) -> None:
        """Gather ``model``'s full weights one tensor at a time into the copy (a collective: every rank calls it)."""
        self.num_pushed = load_full_weights(self._inner.model, model)

    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingConfig, seeds: Sequence[int] | None = None
    ) -> Generation:
        """Sample with the copy; see :meth:`lit_fgrpo.engines.hf.HFEngine.generate`."""
        return self._inner.generate(prompt_ids, sampling, seeds)

    def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0
    ) -> list[torch.Tensor]:
        """Teacher-forced ``log_softmax(z / temperature)`` under the copy, one (T_i,) per row."""
        return self._inner.score(prompt_ids, completion_ids, temperature)
