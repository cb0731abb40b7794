"""Generated prompt sources: a reasoning-gym dataset by name and the registered tasks' splits, read as
:class:`~lit_fgrpo.data.records.SourceExample` rows (the files are :mod:`lit_fgrpo.data.sources`)."""

from __future__ import annotations

from typing import Any

from lit_fgrpo.data.records import SourceExample
from lit_fgrpo.errors import DataError
from lit_fgrpo.tasks.registry import get_task


def read_reasoning_gym(name: str, seed: int, size: int) -> list[SourceExample]:
    """Generate ``size`` entries of a reasoning-gym dataset (offline, deterministic per seed).

    Columns: ``answer`` (the reference answer) and ``entry`` (the whole entry, which ``score_answer`` needs).

    Raises:
        ImportError: If ``reasoning_gym`` is not installed.
        DataError: If no dataset has that name.
    """
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError as err:
        raise ImportError("source='reasoning_gym' needs reasoning-gym: pip install 'lit_fgrpo[reasoning-gym]'") from err
    if name not in DATASETS:
        raise DataError(f"unknown reasoning-gym dataset {name!r}; e.g. {sorted(DATASETS)[:8]}")
    dataset = reasoning_gym.create_dataset(name, seed=seed, size=size)
    examples = [
        SourceExample(question=entry["question"], columns={"answer": entry["answer"], "entry": entry}, index=i)
        for i, entry in enumerate(dataset)
    ]
    if not examples:
        raise DataError(f"reasoning_gym:{name}: the dataset is empty")
    return examples


def read_task_splits(
    name: str, settings: Any, num_train: int, num_val: int, num_test: int, seed: int
) -> dict[str, list[SourceExample]]:
    """Draw a registered task's disjoint train/val/test prompts (:mod:`lit_fgrpo.tasks.registry`).

    Args:
        name: The task's name (``--data.source``).
        settings: The task's settings (``--data.<name>``).
        num_train: Training prompts.
        num_val: Validation prompts.
        num_test: Test prompts.
        seed: Seed of the task's generator.
    """
    splits = get_task(name).splits(settings, num_train, num_val, num_test, seed)
    return {
        split: [SourceExample(question=p.question, columns=dict(p.columns), index=i) for i, p in enumerate(prompts)]
        for split, prompts in splits.items()
    }


__all__ = ["read_reasoning_gym", "read_task_splits"]
