"""The chat template episodes render with: the tokenizer's own or ``--rollout.chat_template``, and its keyword arguments.

Most templates serve multi-turn episodes as they are. Some render an earlier turn differently once a message follows
it (Qwen3 drops an earlier turn's ``<think>`` block; GPT-OSS ends a last turn with ``<|return|>``, an earlier one with
``<|end|>``), so the model's own tokens cannot be continued. TRL ships prefix-preserving versions of those
(``trl/chat_templates/*_training.jinja``); :func:`remedy` names the one for the template in use, found the way TRL
finds it: by comparing the template's text with the originals it stores. TRL is only read from disk when it is
installed (never imported), so this works without it.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lit_fgrpo.errors import ConfigError

CHAT_TEMPLATE_FLAG = "--rollout.chat_template"
END_OF_TURN_FLAG = "--rollout.end_of_turn"
TEMPLATE_KWARGS_FLAG = "--rollout.chat_template_kwargs"

_RESERVED_KWARGS = frozenset(
    {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt", "tokenize"}
)
"""``apply_chat_template`` arguments the episodes set themselves."""


def load_chat_template(value: str | None) -> str | None:
    """The template text of ``--rollout.chat_template``: the value itself when it is template text (it holds
    ``{{`` or ``{%``), else the file it names; ``None`` keeps the tokenizer's template.

    Raises:
        ConfigError: Naming the flag when the value is neither template text nor a readable file.
    """
    if value is None or "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(
            f"{CHAT_TEMPLATE_FLAG} {value!r} is neither template text (no '{{{{' or '{{%') nor a readable file: "
            f"{err.strerror or err}"
        ) from None


def template_kwargs(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """``--rollout.chat_template_kwargs`` as given (e.g. ``{"enable_thinking": false}``), checked.

    Raises:
        ConfigError: Naming the flag when it is not a mapping or sets an argument the episodes set themselves.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{TEMPLATE_KWARGS_FLAG} must be a mapping, got {type(value).__name__}")
    taken = sorted(set(value) & _RESERVED_KWARGS)
    if taken:
        raise ConfigError(f"{TEMPLATE_KWARGS_FLAG} sets {', '.join(taken)}, which the episodes set themselves")
    return dict(value)


def _trl_templates() -> Path | None:
    """The folder of TRL's stored chat templates, when TRL is installed (found without importing it)."""
    try:
        spec = importlib.util.find_spec("trl")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    folder = Path(locations[0]) / "chat_templates" if locations else None
    return folder if folder is not None and folder.is_dir() else None


def trl_training_template(template: str) -> Path | None:
    """TRL's prefix-preserving training version of ``template``, when TRL stores both.

    Args:
        template: The template text in use.

    Returns:
        The path of ``<name>_training.jinja`` (or of the base name's, for a later revision ``<name>_v2``) when
        ``template`` is TRL's stored ``<name>.jinja``; ``None`` otherwise, or when it is a training template already.
    """
    folder = _trl_templates()
    if folder is None:
        return None
    wanted = template.strip()
    for path in sorted(folder.glob("*.jinja")):
        if path.stem.endswith("_training") or path.read_text(encoding="utf-8").strip() != wanted:
            continue
        for name in dict.fromkeys((path.stem, re.sub(r"_v\d+$", "", path.stem))):
            training = folder / f"{name}_training.jinja"
            if training.is_file():
                return training
    return None


def remedy(template: str) -> str:
    """What to set for a template whose earlier turns change once a message follows: TRL's training version of it
    when TRL ships one, else a prefix-preserving template in general."""
    training = trl_training_template(template)
    if training is not None:
        return f"set {CHAT_TEMPLATE_FLAG} {training} (TRL's prefix-preserving training version of this template)"
    return f"set {CHAT_TEMPLATE_FLAG} to a prefix-preserving template (TRL ships some as trl/chat_templates/*_training.jinja)"


def token_at(text: str, tokens: Iterable[str]) -> str | None:
    """The longest of ``tokens`` that ``text`` starts with: the special token right after an assistant turn's text,
    which ends the turn when the EOS token does not (Gemma's ``<end_of_turn>``)."""
    found = [token for token in tokens if token and text.startswith(token)]
    return max(found, key=len) if found else None


def one_line(err: BaseException) -> str:
    """An exception's message on one line (jinja's can span several)."""
    return " ".join(str(err).split()) or type(err).__name__
