"""``RolloutBatch`` (P prompts x G scored completions as tensors) and ``PromptBatch``, the training step's input.

The seam between the rollout callback and the module is the batch itself: the module's
``on_after_batch_transfer`` wraps the data module's ``list[PromptRecord]`` into a :class:`PromptBatch`, the
:class:`~lit_fgrpo.callbacks.RolloutCallback` attaches the collected :class:`RolloutBatch` to it in
``on_train_batch_start`` (and the validation/test counterparts), and ``training_step(batch)`` reads
``batch.rollout``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from lit_fgrpo.data.records import PromptRecord


@dataclass
class RolloutBatch:
    """P prompts x G completions, scored, as padded tensors (B = P * G rows, prompt-major)."""

    input_ids: Tensor
    """(B, Tp + T) left-padded prompt followed by the right-padded completion."""
    attention_mask: Tensor
    """(B, Tp + T) 1 on real tokens."""
    completion_mask: Tensor
    """(B, T) float, 1 on completion tokens that are trained on (up to and including the stop token; in a
    multi-turn episode the model's tokens only, never the environment's)."""
    rewards: Tensor
    """(P, G) float rewards (weighted sum of reward functions; NaN where unscorable)."""
    correct: Tensor
    """(P, G) bool verifier verdicts; they define mu_hat, kept apart from shaping terms."""
    max_completion_length: int
    """L_max of the sampler (the dr_grpo divisor)."""
    sampling_logp: Tensor | None = None
    """(B, T) log-probs reported by the engine at sampling time (for the mismatch correction)."""
    prompts: list[str] = field(default_factory=list)
    """(B,) prompt texts, prompt-major."""
    completions: list[str] = field(default_factory=list)
    """(B,) decoded completions."""
    prompt_ids: list[list[int]] = field(default_factory=list)
    """(P,) prompt token ids, unpadded."""
    completion_ids: list[list[int]] = field(default_factory=list)
    """(B,) sampled completion token ids, unpadded (the weight-sync probe reuses a few rows); for multi-turn
    episodes every token after the row's prompt, model and environment alike (the columns of ``completion_mask``)."""
    stats: dict[str, float] = field(default_factory=dict)
    """Rollout-side statistics of this batch (timings, failed reward calls, dynamic sampling's counts, the
    staleness of an asynchronous batch), logged by the module with the update's metrics under ``rollout/``."""
    row_prompt_ids: list[list[int]] = field(default_factory=list)
    """(B,) each row's own prompt ids, when the rows of a group may have different prompts (multi-turn episodes: a
    ``reset`` observation); empty when row ``r``'s prompt is ``prompt_ids[r // G]``."""
    conversations: list[list[dict[str, str]]] = field(default_factory=list)
    """(B,) multi-turn episodes as ``{role, content}`` messages (the sample table shows them); empty otherwise."""
    faults: list[str] = field(default_factory=list)
    """(B,) why each multi-turn episode is unscorable (its environment fault; ``""`` for a healthy one); empty for
    single-turn rows. The sample table shows it."""
    num_prompts: int = field(init=False)
    """P, from ``rewards`` (set at construction: the update and the callbacks read it at every step)."""
    group_size: int = field(init=False)
    """G, from ``rewards``."""
    completion_length: int = field(init=False)
    """T, the completion columns of ``completion_mask``."""

    def __post_init__(self) -> None:
        self.num_prompts, self.group_size = int(self.rewards.shape[0]), int(self.rewards.shape[1])
        self.completion_length = int(self.completion_mask.shape[1])

    def to(self, device: torch.device | str) -> RolloutBatch:
        """Move the tensors (not the texts) to ``device``."""
        moved: dict[str, Any] = {
            name: (value.to(device) if isinstance(value, Tensor) else value) for name, value in as_plain(self).items()
        }
        return RolloutBatch(**moved)


def as_plain(batch: RolloutBatch) -> dict[str, Any]:
    """A rollout's constructor arguments as a dict of tensors, lists and numbers (what a checkpoint loads without
    pickled classes); ``RolloutBatch(**as_plain(batch))`` rebuilds it."""
    return {f.name: getattr(batch, f.name) for f in fields(batch) if f.init}


@dataclass
class PromptBatch:
    """One step's prompts and, once the rollout callback has run, their scored rollout."""

    records: list[PromptRecord]
    """The P prompts of the step, as the data module yields them."""
    rollout: RolloutBatch | None = None
    """Attached by the rollout callback before ``training_step`` / ``validation_step`` / ``test_step``."""

    def take_rollout(self) -> RolloutBatch:
        """The attached rollout; a clear error names the missing callback when there is none."""
        if self.rollout is None:
            raise RuntimeError(
                "the training step got a batch without a rollout: add lit_fgrpo.callbacks.RolloutCallback to "
                "Trainer(callbacks=[...]) (or attach one yourself: batch.rollout = collector.collect(...))"
            )
        return self.rollout

    @property
    def prompt_ids(self) -> list[list[int]]:
        return [record.prompt_ids for record in self.records]


def as_prompt_batch(batch: Any) -> PromptBatch:
    """Wrap a data module's ``list[PromptRecord]`` (a ``PromptBatch`` passes through unchanged)."""
    return batch if isinstance(batch, PromptBatch) else PromptBatch(records=list(batch))
