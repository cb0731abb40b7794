"""Telling user mistakes from bugs at the CLI, and writing each mistake as one ``error:`` line.

A user mistake is any of: a :class:`lit_fgrpo.errors.UserError`; a jsonargparse parse error (bad flag value, unknown
flag, missing config file); an omegaconf interpolation error; a Lightning ``MisconfigurationException``; a missing or
unreadable path (``FileNotFoundError``, ``IsADirectoryError``, ``PermissionError``); or a ``ValueError`` whose message
starts with one of :data:`USER_VALUE_ERROR_PREFIXES` (checks that name their flag or setting, in files that do not
raise ``UserError`` yet). Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from lit_fgrpo.commands.cli_parse_errors import UNION_HEAD, explain
from lit_fgrpo.errors import ConfigError, UserError

DEBUG_ENV = "LIT_FGRPO_DEBUG"
"""Set to ``1`` to show full tracebacks for user errors (same as ``--debug``)."""
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
        shown = name if len(name) <= 120 else f"{name[:100]}... ({len(name)} characters)"
        try:
            is_file = path.is_file()
        except OSError as err:  # e.g. a whole YAML text given as the name: "File name too long"
            raise ConfigError(f"--config: not a file name ({err.strerror}): {shown}") from None
        if not is_file:
            raise ConfigError(f"--config: no such file: {shown}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            line_number = path.read_bytes()[: err.start].count(b"\n") + 1
            raise ConfigError(f"{name}:{line_number}: not UTF-8 text (byte 0x{err.object[err.start]:02x})") from None
        try:
            data = yaml.safe_load(text)
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            at = f":{mark.line + 1}" if mark is not None else ""
            problem = err.problem or err.context or "invalid YAML"
            raise ConfigError(f"{name}{at}: YAML syntax error: {problem}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{name}: YAML error: {_one_line(str(err))}") from None
        if data is not None and not isinstance(data, dict):
            # jsonargparse would report "Expected a dict" without the file, or take a list as one flag's value.
            raise ConfigError(
                f"{name}: the top level must be a mapping of settings (like trainer:, model:), got a {type(data).__name__}"
            )


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


def file_with_key(key: str, paths: Sequence[str]) -> str | None:
    """The first of the YAML ``paths`` that sets the dotted ``key`` (``model.nosuch``), if any."""
    import yaml

    for name in paths:
        try:
            node = yaml.safe_load(Path(name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        for part in key.split("."):
            if not (isinstance(node, dict) and part in node):
                break
            node = node[part]
        else:  # the file sets the key, even to null (``model: {nosuch: }``); a key of that name elsewhere does not
            return name
    return None


def _argument_error(err: BaseException, paths: Sequence[str] = ()) -> tuple[str, str | None]:
    message = str(getattr(err, "message", None) or err)
    if message.startswith("Problems parsing config"):
        return f"config: {message.split(':', 1)[1]}", None
    unknown = re.search(r"(?:Group '([^']+)' )?does not accept option '([^']+)'", message)
    key = ".".join(part for part in unknown.groups() if part) if unknown else ""
    where = file_with_key(key, paths) if unknown else None
    if unknown and where:
        return f"{where}: {key} is not a setting ({message})", _grouped_hint(key)
    linked = re.search(r"\(([\w., ]+)\) --> ([\w.]+):", message)
    if linked:  # a setting that LightningCLI fills from others (link_arguments) was given itself
        sources = " or ".join(f"--{name.strip()}" for name in linked.group(1).split(","))
        return f"--{linked.group(2)} is set from {sources}; give that instead", None
    flat = re.search(r"unrecognized arguments: --(model|data)\.(\w+)\b", message)
    if flat:
        return message, _grouped_hint(f"{flat.group(1)}.{flat.group(2)}")
    found = explain(err)
    owner = next((key[1:-1] for key in found.keys if key.startswith("(")), None)
    if re.search(r"has no attribute|No module named|does not exist|not found", found.message):
        return found.render(), "class_path must be an importable class, e.g. lit_fgrpo.callbacks.RolloutCallback"
    if owner and found.keys[0] == "trainer.callbacks":
        return found.render(), f"run `lit-fgrpo fit --trainer.callbacks.help {owner}` for its settings and their types"
    return found.render(), _HELP_HINT


def _grouped_hint(key: str) -> str:
    # FGRPOModule's and PromptDataModule's settings were flat before they were grouped: say where an old name lives now.
    from lit_fgrpo.training.module_settings import FLAT_NAMES

    name = key.removeprefix("model.")
    if key.startswith("model.") and name in FLAT_NAMES:
        return f"the model's settings are grouped: use --model.{FLAT_NAMES[name]}.{name} (model: {{{FLAT_NAMES[name]}: ...}})"
    from lit_fgrpo.data.data_settings import flat_names  # the data module's (and its tasks'), likewise

    name = key.removeprefix("data.")
    if key.startswith("data.") and name in flat_names():
        group, field = flat_names()[name]
        return f"the data module's settings are grouped: use --data.{group}.{field} (data: {{{group}: ...}})"
    return _HELP_HINT


def trainer_error_message(err: BaseException) -> str:
    """``"--trainer.devices: `devices` selected with `CPUAccelerator` should be an int > 0."`` from Lightning's text."""
    text = str(err)
    named = re.search(r"`(\w+)(?:=[^`]*)?`", text)
    key = f"--trainer.{named.group(1)}" if named else "--trainer"
    return f"{key}: {text}"


def _model_type_error(err: BaseException) -> tuple[str, str | None] | None:
    # transformers' AutoConfig refuses an unknown model_type with a 2,000-character list; the user wrote one key.
    match = re.match(r"Unrecognized model identifier: (\S+?)\.", str(err)) if type(err) is ValueError else None
    if match is None:
        return None
    return (
        f"--model.policy.model_config: model_type {match.group(1)!r} is not a transformers model type",
        "use one transformers knows, e.g. 'llama' or 'qwen2'",
    )


def _init_value_error(err: BaseException) -> tuple[str, str | None] | None:
    # A ValueError raised by a class's own __init__ check while jsonargparse builds it (a callback's sampling.n, an
    # unknown reward name) arrives wrapped in the Union text; inside it is the check's message.
    if not isinstance(err, ValueError) or not str(err).startswith(UNION_HEAD):
        return None
    found = explain(err)
    owner = next((key[1:-1] for key in found.keys if key.startswith("(")), None)
    hint = f"run `lit-fgrpo fit --trainer.callbacks.help {owner}` for its settings" if owner else None
    return found.render(), hint


def _init_parameters(class_name: str) -> set[str]:
    import inspect

    import lit_fgrpo.callbacks as callbacks
    from lit_fgrpo.data.datamodule import PromptDataModule
    from lit_fgrpo.training.module import FGRPOModule

    owners = {"FGRPOModule": FGRPOModule, "PromptDataModule": PromptDataModule}
    owner = owners.get(class_name) or getattr(callbacks, class_name, None)
    if not inspect.isclass(owner):
        return set()
    return set(inspect.signature(owner.__init__).parameters) - {"self", "args", "kwargs"}


def names_a_setting(message: str) -> bool:
    """Whether a plain ``ValueError`` message starts with ``Class.setting`` of a class the CLI builds.

    Checks that run later than ``__init__`` (``RolloutCallback.val_samples=4 is fewer than the largest pass@k k=8``)
    name the setting that way; a message naming a method (``PromptDataModule.draw_prompts: ...``) is a bug.
    """
    match = re.match(r"(\w+)\.(\w+)\b(?!\()", message)
    return match is not None and match.group(2) in _init_parameters(match.group(1))


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
        return _argument_error(err, paths)
    wrapped = _init_value_error(err) or _model_type_error(err)
    if wrapped is not None:
        return wrapped
    module = type(err).__module__
    if module.startswith("omegaconf"):
        return _interpolation(err, paths), None
    if type(err).__name__ == "MisconfigurationException":
        return str(err), None
    if isinstance(err, FileNotFoundError | IsADirectoryError | PermissionError | NotADirectoryError):
        if err.filename is not None:
            return f"{err.filename}: {err.strerror or type(err).__name__}", None
        return str(err), None
    if type(err) is ValueError and (str(err).startswith(USER_VALUE_ERROR_PREFIXES) or names_a_setting(str(err))):
        return str(err), None
    return None


CLASS_FLAGS = {"FGRPOModule.": "--model.", "PromptDataModule.": "--data.", "RolloutCallback.": "--rollout."}
"""Messages of the module's and data module's own checks start with the class; the user knows the flag."""


def as_flag(message: str) -> str:
    """``"PromptDataModule.num_train must be >= 1"`` -> ``"--data.num_train must be >= 1"`` (other text unchanged)."""
    for prefix, flag in CLASS_FLAGS.items():
        if message.startswith(prefix) and re.match(r"\w", message[len(prefix) :]):
            return flag + message[len(prefix) :]
    return message


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
            text = f"error: {_one_line(as_flag(message))}"
            return text + (f"\nhint: {_one_line(hint)}" if hint else "")
    return None


def subcommand_error(name: str, err: BaseException) -> str:
    """``"lit-fgrpo <name>: error: ..."`` (plus its hint line) for an error a subcommand reports itself."""
    message = user_error_message(err) or f"error: {_one_line(str(err))}"
    message = message.replace("`lit-fgrpo fit --help`", f"`lit-fgrpo {name} --help`")
    return f"lit-fgrpo {name}: {message}"


def run_command(name: str, main: Callable[[list[str]], int], words: list[str], debug: bool = False) -> int:
    """``main(words)`` of the subcommand ``name``, a user mistake printed as one ``lit-fgrpo <name>: error:`` line
    (status 2); with ``debug``, or for a bug, the exception propagates with its traceback."""
    try:
        return int(main(words))
    except Exception as err:
        if debug or user_error_message(err) is None:
            raise
        print(subcommand_error(name, err), file=sys.stderr)
        return 2


def wants_debug(words: Sequence[str]) -> bool:
    """Whether tracebacks are asked for: ``--debug`` anywhere among ``words``, or :data:`DEBUG_ENV` set."""
    return "--debug" in words or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def run_as_script(name: str, main: Callable[[list[str]], int]) -> int:
    """What ``lit-fgrpo <name> ...`` does, for ``python -m <the command's module> ...``."""
    words = sys.argv[1:]
    return run_command(name, main, [word for word in words if word != "--debug"], wants_debug(words))
