"""Sampling seeds that depend on what is sampled, not on where: a prompt's global stream position and the step.

Seeding every rank with ``seed + step`` makes a prompt's completions depend on the rank layout (which rank holds
the prompt, which prompts share its generate call). :func:`prompt_seed` gives each prompt occurrence its own seed
from ``(base_seed, position, step, stream)``, so 1 rank or 16 draw the same completions for the same prompt,
provided the engine samples each prompt with its own generator (vLLM: ``SamplingParams(seed=...)`` per request).
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1
SEED_BITS = 63
"""Seeds lie in ``[0, 2**63)``: valid for ``torch.Generator.manual_seed``, numpy and vLLM."""


def _splitmix64(x: int) -> int:
    """One round of SplitMix64 (Steele et al. 2014): a bijective, well-mixing map of 64-bit integers."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def prompt_seed(base_seed: int, position: int, step: int, stream: int = 0) -> int:
    """The sampling seed of the prompt at global stream ``position`` sampled at optimizer ``step``.

    ``seed = splitmix64(splitmix64(splitmix64(splitmix64(base_seed) ^ stream) ^ position) ^ step) >> 1``:
    chained mixing, so nearby inputs (position ``p`` at step ``s`` vs ``p + 1`` at ``s - 1``) give unrelated seeds,
    unlike a sum such as ``base_seed + position + step``.

    Args:
        base_seed: The run's sampling seed.
        position: Global position of the prompt in its stream (:attr:`PromptRecord.position`), independent of the
            rank layout.
        step: The trainer's global step at sampling time (distinguishes repeated evaluation passes).
        stream: Which stream: e.g. 0 training, 1 validation, 2 test (their positions overlap).

    Returns:
        An integer in ``[0, 2**63)``.

    Raises:
        ValueError: If ``position`` or ``step`` is negative (a record that did not come from a stream).
    """
    if position < 0 or step < 0:
        raise ValueError(f"prompt_seed needs position >= 0 and step >= 0, got position={position}, step={step}")
    x = _splitmix64(base_seed & _MASK64)
    for value in (stream, position, step):
        x = _splitmix64(x ^ (value & _MASK64))
    return x >> (64 - SEED_BITS)
