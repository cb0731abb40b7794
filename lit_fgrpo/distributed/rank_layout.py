"""What each rank takes and with which seed, independent of the rank layout.

Global batch sizes: the count a config gives is over all ranks; each rank takes an equal share. Sampling seeds
that depend on what is sampled, not on where: a prompt's global stream position and the step.

Seeding every rank with ``seed + step`` makes a prompt's completions depend on the rank layout (which rank holds
the prompt, which prompts share its generate call). :func:`prompt_seed` gives each prompt occurrence its own seed
from ``(base_seed, position, step, stream)``, so 1 rank or 16 draw the same completions for the same prompt,
provided the engine samples each prompt with its own generator (vLLM: ``SamplingParams(seed=...)`` per request).
"""

from __future__ import annotations


def per_rank_share(global_count: int, world_size: int, flag: str) -> int:
    """The per-rank share of a global count, refusing one that does not divide by the world size.

    ``prompts_per_step`` and ``mini_batch_prompts`` are global, as TRL, verl and the paper report them: 256 prompts
    per step means 256 on one GPU or over 16. Prompts (with all G samples of each) are the unit, so every group
    stays on one rank.

    Args:
        global_count: The count over all ranks.
        world_size: Number of ranks (``devices x num_nodes``).
        flag: The setting's name for the error message, e.g. ``--data.loader.prompts_per_step``.

    Raises:
        ValueError: One line naming the flag and the numbers when ``global_count`` is not a positive multiple of
            ``world_size``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if global_count < world_size or global_count % world_size:
        lower = max(world_size, global_count // world_size * world_size)
        raise ValueError(
            f"{flag}={global_count} is global (all ranks) and must be a multiple of the world size {world_size} "
            f"(devices x num_nodes); e.g. {lower} or {lower + world_size}"
        )
    return global_count // world_size


def per_rank_mini_batch(mini_batch_prompts: int | None, world_size: int) -> int | None:
    """This rank's share of the global ``mini_batch_prompts`` (``None``, one optimizer step per batch, stays ``None``).

    With the strided layout of :class:`~lit_fgrpo.data.streaming.PromptStream`, local mini-batch ``j`` of every rank
    together is global mini-batch ``j`` (prompts ``[j * M, (j + 1) * M)`` of the global batch).

    Raises:
        ValueError: Naming ``--model.batching.mini_batch_prompts`` when it does not divide by ``world_size``.
    """
    if mini_batch_prompts is None:
        return None
    return per_rank_share(mini_batch_prompts, world_size, "--model.batching.mini_batch_prompts")


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


def prompt_seeds(base_seed: int, positions: list[int], step: int, stream: int = 0) -> list[int]:
    """:func:`prompt_seed` of each of a batch's prompt ``positions``, in order."""
    return [prompt_seed(base_seed, position, step, stream) for position in positions]
