"""Telling user mistakes from bugs at the CLI, and writing each mistake as one ``error:`` line.

A user mistake is any of: a :class:`lit_fgrpo.errors.UserError`; a jsonargparse parse error (bad flag value, unknown
flag, missing config file); an omegaconf interpolation error; a Lightning ``MisconfigurationException``; a missing or
unreadable path (``FileNotFoundError``, ``IsADirectoryError``, ``PermissionError``); or a ``ValueError`` whose message
starts with one of :data:`USER_VALUE_ERROR_PREFIXES` (checks that name their flag or setting, in files that do not
raise ``UserError`` yet). Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from lit_fgrpo.errors import ConfigError, UserError

MAX_LINE = 400
"""Longest ``error:`` line; longer messages are cut with an ellipsis."""

USER_VALUE_ERROR_PREFIXES = ("--", "PromptDataModule.", "cannot resume the prompt stream")
"""Plain ``ValueError`` messages that are user mistakes: a flag named ``--group.key``, a data-module setting, a resume
into a dataset of another size. A bridge until those raises use :mod:`lit_fgrpo.errors`."""

_HELP_HINT = "run `lit-fgrpo fit --help` for every setting and its type"


def config_paths(words: Sequence[str]) -> list[str]:
    """The files given to ``--config`` / ``-c`` on a command line, in order."""
    paths: list[str] = []
    for i, word in enumerate(words):
        if word in ("--config", "-c") and i + 1 < len(words):
            paths.append(words[i + 1])
        elif word.startswith("--config="):
            paths.append(word.split("=", 1)[1])
    return paths


def precheck_config_files(words: Sequence[str]) -> None:
    """Refuse a missing, non-UTF-8 or syntactically broken YAML config naming the file and 1-based line.

    Raises:
        ConfigError: ``"<file>:<line>: YAML syntax error: ..."`` and the like.
    """
    import yaml

    for name in config_paths(words):
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"--config: no such file: {name}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            line_number = path.read_bytes()[: err.start].count(b"\n") + 1
            raise ConfigError(f"{name}:{line_number}: not UTF-8 text (byte 0x{err.object[err.start]:02x})") from None
        try:
            yaml.safe_load(text)
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            at = f":{mark.line + 1}" if mark is not None else ""
            problem = err.problem or err.context or "invalid YAML"
            raise ConfigError(f"{name}{at}: YAML syntax error: {problem}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{name}: YAML error: {_one_line(str(err))}") from None


def _one_line(text: str) -> str:
    line = re.sub(r"\s+", " ", text).strip()
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…"


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


def _argument_error(message: str) -> tuple[str, str | None]:
    message = re.sub(r"<class '([\w.]+)'>", r"\1", message)
    match = re.match(r'\s*Parser key "([^"]+)":\s*(.*)', message, flags=re.S)
    if match:
        key, rest = match.groups()
        rest = re.sub(r"Expected a (.+?)\. Got value: (.*)", r"expected \1, got \2", rest, flags=re.S)
        return f"--{key}: {rest}", _HELP_HINT
    if message.startswith("Problems parsing config"):
        return f"config: {message.split(':', 1)[1]}", None
    return message, _HELP_HINT


def _interpolation(err: BaseException, paths: Sequence[str]) -> str:
    text = str(err)
    key = re.search(r"Interpolation key '([^']+)'", text)
    full_key = re.search(r"full_key: (\S+)", text)
    where = ""
    if key:
        # omegaconf+ resolves after merging, with absolute keys rewritten as relative ones (${.model.x}) under the
        # subcommand (fit.seed_everything): report them as the user wrote them.
        name_in_file = key.group(1).lstrip(".")
        setting_key = full_key.group(1) if full_key else ""
        for sub in ("fit.", "validate.", "test.", "predict."):
            setting_key = setting_key.removeprefix(sub)
        for name in paths:
            try:
                if "${" + name_in_file in Path(name).read_text(encoding="utf-8"):
                    where = f"{name}: "
                    break
            except OSError:
                continue
        setting = f" in {setting_key}" if setting_key else ""
        return f"{where}interpolation ${{{name_in_file}}}{setting} refers to a missing key"
    return f"config interpolation: {text.splitlines()[0]}"


def _classify(err: BaseException, paths: Sequence[str]) -> tuple[str, str | None] | None:
    if isinstance(err, UserError):
        return str(err), err.hint
    if isinstance(err, argparse.ArgumentError):
        return _argument_error(str(err.message if hasattr(err, "message") else err))
    module = type(err).__module__
    if module.startswith("omegaconf"):
        return _interpolation(err, paths), None
    if type(err).__name__ == "MisconfigurationException":
        return str(err), None
    if isinstance(err, FileNotFoundError | IsADirectoryError | PermissionError | NotADirectoryError):
        if err.filename is not None:
            return f"{err.filename}: {err.strerror or type(err).__name__}", None
        return str(err), None
    if type(err) is ValueError and str(err).startswith(USER_VALUE_ERROR_PREFIXES):
        return str(err), None
    return None


def user_error_message(err: BaseException, config_files: Sequence[str] = ()) -> str | None:
    """``"error: ..."`` (plus ``"\\nhint: ..."``) if ``err`` or an exception it was raised from is a user mistake.

    Args:
        err: The exception that ended the command.
        config_files: The ``--config`` files, to say which one holds a broken interpolation.

    Returns:
        The text to print, or ``None`` for a bug (the caller re-raises it).
    """
    for cause in _chain(err):
        found = _classify(cause, config_files)
        if found is not None:
            message, hint = found
            text = f"error: {_one_line(message)}"
            return text + (f"\nhint: {_one_line(hint)}" if hint else "")
    return None
