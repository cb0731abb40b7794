"""``--arms`` as the strings the user typed: YAML would read an unquoted ``8:0`` as the base-60 number 480.

YAML 1.1 (PyYAML, and so jsonargparse) reads ``8:0`` as 8 * 60 + 0 = 480 and ``8:0.5`` as 480.5, so
``--arms '[8:0, 8:0.5]'`` would reach the sweep as two numbers. On the command line the list is split here, by
hand, into strings; in a config file (where this module cannot see the text before YAML does) a number among the arms
is refused with the way to quote it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lit_fgrpo.errors import ConfigError

QUOTE_HINT = "quote each arm: arms: ['8:0', '8:0.5'] (YAML reads an unquoted 8:0 as the base-60 number 480)"


def arms_as_json(text: str) -> str:
    """``"[8:0, 8:0.5]"`` or ``"8:0"`` -> ``'["8:0", "8:0.5"]'`` (items split at commas, quotes stripped)."""
    inner = text.strip()
    if inner.startswith("[") and inner.endswith("]"):
        inner = inner[1:-1]
    return json.dumps([item.strip().strip("'\"") for item in inner.split(",") if item.strip()])


def quote_arms(words: Sequence[str]) -> list[str]:
    """``words`` with the value of every ``--arms`` (``--arms V`` or ``--arms=V``) rewritten by :func:`arms_as_json`."""
    out: list[str] = []
    take_next = False
    for word in words:
        if take_next:
            out.append(arms_as_json(word))
            take_next = False
        elif word == "--arms":
            out.append(word)
            take_next = True
        elif word.startswith("--arms="):
            out.append("--arms=" + arms_as_json(word.split("=", 1)[1]))
        else:
            out.append(word)
    return out


def check_config_arms(words: Sequence[str]) -> None:
    """Refuse an ``arms`` entry of a ``--config`` file that YAML read as a number.

    Raises:
        ConfigError: ``"<file>: arms: 480 is a number, not 'N:gamma'"`` with :data:`QUOTE_HINT`.
    """
    import yaml

    for i, word in enumerate(words[:-1]):
        if word != "--config":
            continue
        path = Path(words[i + 1])
        if not path.is_file():
            continue  # the parser names a missing file
        try:
            data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError):
            continue  # the parser names a broken file
        arms = data.get("arms") if isinstance(data, dict) else None
        for arm in arms if isinstance(arms, list) else []:
            if isinstance(arm, int | float) and not isinstance(arm, bool):
                raise ConfigError(f"{path}: arms: {arm!r} is a number, not 'N:gamma'", hint=QUOTE_HINT)
