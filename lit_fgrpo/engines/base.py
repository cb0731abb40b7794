"""The engine interface every rollout backend implements (HF ``generate``, vLLM).

An engine turns token-id prompts into ``n`` sampled completions per prompt and can receive new policy
weights. Rows are prompt-major: completion ``j`` of prompt ``i`` is row ``i * n + j``, so a (B,) vector
reshapes to (P, G) with ``.view(P, G)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

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
