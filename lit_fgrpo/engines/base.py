"""The engine interface every rollout backend implements (HF ``generate``, vLLM).

An engine turns token-id prompts into ``n`` sampled completions per prompt and can receive new policy
weights. Rows are prompt-major: completion ``j`` of prompt ``i`` is row ``i * n + j``, so a (B,) vector
reshapes to (P, G) with ``.view(P, G)``. :func:`pad_rollouts` packs prompts and a :class:`Generation` into the
padded tensors the trainer and the scorers read (prompts right-aligned to one width, so every completion starts at
the same column).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lit_fgrpo.engines.sync_check import check_logprob_gap
from lit_fgrpo.errors import ConfigError


@dataclass
class SamplingConfig:
    """How completions are sampled during rollouts and validation."""

    n: int = 8
    """Completions per prompt (the group size G)."""
    temperature: float = 1.0
    """Sampling temperature; also applied to the training logits so that ratios compare like with like."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = -1
    """Top-k sampling (-1 = off)."""
    max_tokens: int = 64
    """Maximum completion length in tokens (L_max)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end a completion (the stop token itself is kept and trained on). EOS is always a stop."""
    seed: int | None = None
    """Base seed for sampling; ``None`` draws from the global RNG. Engines give prompt ``i`` the seed
    ``seed + i * n`` unless ``generate`` receives per-prompt ``seeds``."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"rollout.sampling.n must be >= 1, got {self.n}")
        if self.temperature <= 0:
            raise ConfigError(f"rollout.sampling.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ConfigError(f"rollout.sampling.max_tokens must be >= 1, got {self.max_tokens}")


@dataclass
class Generation:
    """What an engine returns for P prompts x n samples (B = P * n rows, prompt-major)."""

    completion_ids: list[list[int]]
    """(B,) lists of sampled token ids, each ending at (and including) its stop token when one was hit."""
    sampling_logprobs: list[list[float]] | None = None
    """(B,) per-token log-probs under the engine's sampling distribution, when the engine reports them."""
    finished: list[bool] = field(default_factory=list)
    """(B,) True when the completion ended with a stop token, False when it was cut at max_tokens."""


class RolloutEngine(ABC):
    """A generation backend. Implementations: :class:`lit_fgrpo.engines.hf.HFEngine`, ``VLLMEngine``.

    ``generate``, ``sync_weights`` and ``score`` are required; ``sleep``, ``wake_up`` and ``close`` default to
    no-ops, so an engine that holds no accelerator memory of its own (HF ``generate``) need not define them.
    """

    collective_rounds: bool = False
    """Whether the ranks share this engine and each ``generate`` is a collective round (every rank must make the same
    calls): multi-turn episodes then advance in lockstep."""
    has_own_weights: bool = True
    """Whether the engine samples from weights of its own, which only :meth:`sync_weights` changes. False for an
    engine that samples with the trainer's policy module itself (:class:`~lit_fgrpo.engines.hf.HFEngine`): the
    optimizer would change its weights in the middle of a generation (no asynchronous rollouts), and a push has
    nothing to move or check (the engine's log-probs are the trainer's)."""

    @abstractmethod
    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingConfig, seeds: Sequence[int] | None = None
    ) -> Generation:
        """Sample ``sampling.n`` completions for each prompt (lists of token ids, no padding).

        Args:
            prompt_ids: P prompts.
            sampling: sampling settings.
            seeds: one seed per prompt. Prompt ``i``'s completions then depend only on ``seeds[i]`` and the weights,
                not on the other prompts of the call (so not on the rank layout). ``None``: derived from
                ``sampling.seed`` (``sampling.seed + i * n``), or unseeded when that is ``None`` too.
        """

    @abstractmethod
    def sync_weights(self, model: nn.Module) -> None:
        """Load the trainer's current policy weights into the engine."""

    @abstractmethod
    def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0
    ) -> list[torch.Tensor]:
        """``log_softmax(z / temperature)`` of given completions under the engine's weights; one (T_i,) per row.

        The weight-sync check calls it at ``temperature=1``.
        """

    def check_sync(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        trainer_logprobs: list[torch.Tensor],
        tolerance: float,
        where: str,
    ) -> float:
        """The weight-sync check: ``max |score - trainer_logprobs|``, raising ``WeightSyncError`` beyond
        ``tolerance``. An engine with several copies of the weights (servers) checks each of them."""
        return check_logprob_gap(self.score(prompt_ids, completion_ids), trainer_logprobs, tolerance, where)

    def last_push_metrics(self) -> dict[str, float]:
        """Metrics of the last :meth:`sync_weights` to log with it (none by default)."""
        return {}

    def join_round(self, sampling: SamplingConfig) -> None:  # noqa: B027 - an optional hook with a no-op default
        """Take part in a round of ``generate`` calls without prompts of this rank's own (dynamic sampling's skipping
        ranks). A no-op unless the ranks share one engine (:class:`~lit_fgrpo.servers.ranks.RankedEngine`),
        whose calls are collectives."""

    def finish_rounds(self) -> None:  # noqa: B027
        """This rank's evaluation pass is over; with an engine shared by the ranks, take part in the others' remaining
        calls until every rank's pass is over (no-op by default)."""

    def sleep(self) -> None:  # noqa: B027 - an optional hook with a no-op default
        """Free accelerator memory for the optimizer step (no-op by default)."""

    def wake_up(self) -> None:  # noqa: B027
        """Bring a sleeping engine back before it generates, scores or receives weights (no-op by default)."""

    def close(self) -> None:  # noqa: B027
        """Release the engine's resources at teardown (no-op by default)."""


def pad_rollouts(
    prompt_ids: list[list[int]],
    generation: Generation,
    group_size: int,
    pad_token_id: int,
    mask_truncated: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Pack prompts and their completions into padded tensors.

    Args:
        prompt_ids: P prompts as token lists.
        generation: the engine's output, B = P * group_size rows, prompt-major.
        group_size: G.
        pad_token_id: filler id (its positions are masked, so its value never matters).
        mask_truncated: zero the loss mask of completions cut at max_tokens (DAPO's overlong filtering).

    Returns:
        ``input_ids`` (B, Tp + T), ``attention_mask`` (B, Tp + T), ``completion_mask`` (B, T) and
        ``sampling_logp`` (B, T) or None.
    """
    rows = len(generation.completion_ids)
    if rows != len(prompt_ids) * group_size:
        raise ValueError(f"engine returned {rows} rows for {len(prompt_ids)} prompts x {group_size} samples")
    prompt_width = max(len(p) for p in prompt_ids)
    comp_width = max(1, max((len(c) for c in generation.completion_ids), default=1))
    input_ids = torch.full((rows, prompt_width + comp_width), pad_token_id, dtype=torch.long)  # (B, Tp + T)
    attention_mask = torch.zeros_like(input_ids)  # (B, Tp + T)
    completion_mask = torch.zeros((rows, comp_width), dtype=torch.float32)  # (B, T)
    has_logp = generation.sampling_logprobs is not None
    sampling_logp = torch.zeros((rows, comp_width), dtype=torch.float32) if has_logp else None  # (B, T)
    for row, completion in enumerate(generation.completion_ids):
        prompt = prompt_ids[row // group_size]
        input_ids[row, prompt_width - len(prompt) : prompt_width] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, prompt_width - len(prompt) : prompt_width] = 1
        n = len(completion)
        if n:
            input_ids[row, prompt_width : prompt_width + n] = torch.tensor(completion, dtype=torch.long)
            attention_mask[row, prompt_width : prompt_width + n] = 1
            truncated = bool(generation.finished) and not generation.finished[row]
            completion_mask[row, :n] = 0.0 if (mask_truncated and truncated) else 1.0
            if sampling_logp is not None and generation.sampling_logprobs is not None:
                sampling_logp[row, :n] = torch.tensor(generation.sampling_logprobs[row][:n], dtype=torch.float32)
    return input_ids, attention_mask, completion_mask, sampling_logp
