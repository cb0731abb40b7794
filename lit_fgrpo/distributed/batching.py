"""Global batch sizes: the count a config gives is over all ranks; each rank takes an equal share."""

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
