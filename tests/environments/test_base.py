"""The environment interface's loader: what ``--rollout.environment`` accepts, and its one-line errors.

Reference: TRL's ``environment_factory`` rule for tools (functions defined on the class whose names do not start with
``_``, other than ``reset`` and ``get_reward``; ``step`` is ours), written out per class.
"""

from __future__ import annotations

from typing import Any

import pytest

from lit_fgrpo.environments import load_environment, load_environments, tool_names
from lit_fgrpo.environments.calculator import Calculator
from lit_fgrpo.environments.retry import RetryArithmetic
from lit_fgrpo.errors import ConfigError
from tests.environments.sample_envs import Mixed

HERE = "tests.environments.sample_envs"


def test_public_functions_are_the_tools() -> None:
    assert tool_names(Mixed) == ["look", "shout"]  # not reset/step/get_reward, _helper, the property or LIMIT
    factory = load_environment(f"{HERE}:Mixed", {"scale": 2})
    assert (factory.tools, factory.has_step, factory.has_reward, factory.name) == (
        ("look", "shout"),
        True,
        True,
        "Mixed",
    )
    assert [s["function"]["name"] for s in factory.tool_schemas()] == ["look", "shout"]
    assert factory.tool_schemas()[0]["function"]["parameters"]["required"] == ["where"]  # no `self`
    instance = factory.make()
    assert type(instance).__name__ == "Mixed" and instance.scale == 2 and factory.make() is not instance


def test_built_in_names_dotted_paths_and_classes_load() -> None:
    assert load_environment("retry").cls is RetryArithmetic
    assert load_environment("calculator").tools == ("add", "multiply")
    assert load_environment("lit_fgrpo.environments.calculator.Calculator").cls is Calculator
    assert load_environment(Calculator).cls is Calculator


@pytest.mark.parametrize(
    ("target", "args", "message"),
    [
        (
            "no_such_pkg.envs:Calculator",
            None,
            r"^--rollout\.environment 'no_such_pkg\.envs:Calculator' does not import: ModuleNotFoundError: No module named 'no_such_pkg'$",
        ),
        (
            f"{HERE}:Missing",
            None,
            r"^--rollout\.environment 'tests\.environments\.sample_envs:Missing' does not import: module 'tests\.environments\.sample_envs' has no 'Missing'$",
        ),
        (
            "Calculator",
            None,
            r"^--rollout\.environment 'Calculator': expected 'package\.module:name' or one of \['calculator', 'retry'\]$",
        ),
        (
            f"{HERE}:NOT_A_CLASS",
            None,
            r"^--rollout\.environment 'tests\.environments\.sample_envs:NOT_A_CLASS' is a str, not a class or a factory$",
        ),
        (f"{HERE}:NoReset", None, r"^--rollout\.environment NoReset has no reset\(\*\*row\) method$"),
        (
            f"{HERE}:Silent",
            None,
            r"^--rollout\.environment Silent has no tools \(public methods\), is not a TextEnvironment with step\(reply\)",
        ),
        (
            f"{HERE}:Mixed",
            {"size": 2},
            r"^--rollout\.environment_args \{'size': 2\} do not fit Mixed \(it takes scale\): got an unexpected keyword argument 'size'$",
        ),
        (f"{HERE}:BadTool", None, r"^--rollout\.environment BadTool: tool BadTool\.go needs a type hint"),
    ],
)
def test_a_class_that_cannot_serve_is_one_line_naming_the_setting(target: str, args: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_environments(target, args)
    assert "\n" not in str(err.value)
