"""The task registry: a task registered from outside the package is a data source by its name, with its settings
group, its tokenizer and its reward, and the core (data/, models/, rollout/) names no task.

Reference: a five-line toy task written here ("count to n", answered by the last number), and the built-in tasks'
registrations, which must keep every old name working (``--data.source maze``, ``builtin:maze``, reward ``maze``).
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lit_fgrpo.data import PromptDataModule
from lit_fgrpo.data.data_settings import settings_groups, source_names
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from lit_fgrpo.tasks import MazeConfig, Task, TaskPrompt, build_word_tokenizer, get_task, load_tokenizer
from lit_fgrpo.tasks.registry import default_task, register_task, task_names, unregister_task

PACKAGE = Path(__file__).resolve().parents[2] / "lit_fgrpo"
WORDS = ["<pad>", "<bos>", "<eos>", "<unk>", "count", "to", *map(str, range(10))]


@dataclass(frozen=True)
class CountSettings:
    """The toy task's settings (``--data.count.top``)."""

    top: int = 9
    """Largest number asked for."""

    def __post_init__(self) -> None:
        if not 1 <= self.top <= 9:
            raise ConfigError(f"--data.count.top must be in [1, 9], got {self.top}")


def count_prompts(settings: CountSettings, num_train: int, num_val: int, num_test: int, seed: int) -> dict:
    """``count to n`` prompts (answer: the numbers 1..n), drawn with the seed."""
    rng = random.Random(seed)
    draw = [rng.randint(1, settings.top) for _ in range(num_train + num_val + num_test)]
    prompts = [TaskPrompt(f"count to {n}", {"answer": " ".join(map(str, range(1, n + 1)))}) for n in draw]
    return {"train": prompts[:num_train], "val": prompts[num_train : num_train + num_val], "test": prompts[-num_test:]}


@pytest.fixture
def count_task() -> Iterator[Task]:
    task = Task(name="count", settings=CountSettings, splits=count_prompts, reward="last_number",
                tokenizer=lambda: build_word_tokenizer(WORDS))  # fmt: skip
    register_task(task)
    yield task
    unregister_task("count")


def test_a_registered_task_is_a_data_source_by_its_name(count_task: Task) -> None:
    splits = {"num_train": 6, "num_val": 2, "num_test": 1}
    dm = PromptDataModule(source="count", count={"top": 3}, splits=splits, seed=4)
    dm.setup("fit")  # the task's own tokenizer, as the maze's word tokenizer for the maze
    expected = count_prompts(CountSettings(top=3), 6, 2, 1, seed=4)
    for name, records in dm.splits.items():
        assert [r.prompt for r in records] == [p.question for p in expected[name]]
        assert [r.columns["answer"] for r in records] == [p.columns["answer"] for p in expected[name]]
        assert [r.index for r in records] == list(range(len(records)))
    assert dm.tokenizer.convert_ids_to_tokens(dm.splits["train"][0].prompt_ids)[:2] == ["count", "to"]
    # its settings are a group of the data module's, saved plainly and rebuilt by name
    assert "count" in settings_groups() and "count" in source_names()
    assert dm.hparams["count"] == {"top": 3} and dm.task_settings["count"] == CountSettings(top=3)
    assert PromptDataModule(**dm.hparams).hparams == dm.hparams
    assert len(load_tokenizer("builtin:count")) == len(WORDS)
    assert get_task("count").reward == "last_number"
    with pytest.raises(ConfigError, match=r"^--data.count.top must be in \[1, 9\], got 0$"):
        PromptDataModule(source="count", count={"top": 0})


def test_an_unregistered_task_is_no_source(count_task: Task) -> None:
    unregister_task("count")
    with pytest.raises(ConfigError, match=r"^--data.source must be one of .*'maze'.*, got 'count'$"):
        PromptDataModule(source="count")
    with pytest.raises(ConfigError, match=r"^--data.count is not a setting of PromptDataModule"):
        PromptDataModule(count={"top": 3})
    with pytest.raises(ConfigError, match=r"^--model.policy.tokenizer: no built-in tokenizer 'builtin:count'"):
        load_tokenizer("builtin:count")
    register_task(count_task)  # for the fixture's teardown


def test_the_built_in_tasks_keep_their_names() -> None:
    assert task_names()[:2] == ("maze", "arithmetic") and default_task().name == "maze"
    assert PromptDataModule().source == "maze" and PromptDataModule().task_settings["maze"] == MazeConfig()
    assert RolloutSettings().reward_names == ["maze"]  # a run that gives no reward scores with the maze's
    assert get_task("arithmetic").reward == "last_number"
    assert load_tokenizer("builtin:maze").convert_ids_to_tokens([4, 16]) == ["GRID_START", "RIGHT"]
    with pytest.raises(ValueError, match="default task"):
        unregister_task("maze")
    with pytest.raises(ValueError, match="registered already"):
        register_task(Task(name="maze", settings=CountSettings, splits=count_prompts))


def code_names(path: Path) -> set[str]:
    """The words a module's code uses (names, attributes, imports, strings), docstrings (attribute docstrings too:
    every string that stands alone as a statement) and comments left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.add(node.value)
        elif isinstance(node, ast.Name | ast.Attribute | ast.alias | ast.ImportFrom | ast.arg):
            words.add(str(getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", None)
                          or getattr(node, "module", None) or getattr(node, "arg", "")))  # fmt: skip
    return words


@pytest.mark.parametrize("folder", ["data", "models", "rollout"])
def test_the_core_names_no_task(folder: str) -> None:
    # data/, models/ and rollout/ find a task through the registry only: no task's name in their code
    named = {
        f"{path.relative_to(PACKAGE)}: {word!r}"
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for word in code_names(path)
        if any(task in word.lower() for task in ("maze", "arith"))
    }
    assert named == set()
    assert code_names(Path(__file__)) >= {"count_prompts", "maze"}  # the reference: this file's code does name them


def test_the_cli_has_a_group_for_each_registered_task(count_task: Task) -> None:
    from lit_fgrpo.commands.plan import parse_fit_config  # fit's own parser, nothing instantiated

    config = parse_fit_config(["--data.source", "count", "--data.count.top", "3", "--data.maze.rows", "5"])
    assert config.data.source == "count" and config.data.count.top == 3 and config.data.maze.rows == 5
    assert parse_fit_config([]).data.source == "maze"  # a run that names no source: the default task
