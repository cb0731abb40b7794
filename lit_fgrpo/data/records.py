"""Prompt records: a source's raw rows (:class:`SourceExample`) rendered into what the policy sees.

The readers (:mod:`lit_fgrpo.data.sources`: JSONL, Parquet, ``datasets`` folders; :mod:`lit_fgrpo.data.generated_sources`:
reasoning-gym, the tasks) return :class:`SourceExample` rows (the raw question plus answer and extra columns);
:func:`render_records` turns them into :class:`PromptRecord` rows with the prompt text the policy sees and its token
ids. The ``environment`` source has no question to render: its records are made whole
(:mod:`lit_fgrpo.data.environment_rows`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_fgrpo.errors import DataError

log = logging.getLogger(__name__)

NonStringAnswers = Literal["error", "str"]
"""What to do with a required column (the answer) that is not a string: ``"error"`` (default) refuses the row naming
its file, line and type; ``"str"`` converts numbers with ``str()`` (``3`` -> ``"3"``, ``0.5`` -> ``"0.5"``) and logs how
many rows were converted. Lists, dicts and booleans are always refused: their ``str()`` is never a meant answer."""

TooLongPolicy = Literal["error", "truncate_left", "skip"]
"""What to do with a prompt longer than ``max_prompt_length`` tokens."""
MAX_LENGTH = "--data.prompts.max_length"
"""The flag of the prompt length limit, named in the messages."""
TOO_LONG = "--data.prompts.too_long"
"""The flag of the too-long policy, named in the messages."""

Question = str | list[dict[str, str]]
"""A plain question, or a conversation as ``[{"role": ..., "content": ...}, ...]`` (TRL's conversational format)."""


@dataclass
class SourceExample:
    """One row as read from a source, before rendering and tokenization."""

    question: Question
    """The prompt field: text, or a list of chat messages."""
    columns: dict[str, Any] = field(default_factory=dict)
    """Every other field of the row (the answer and extra columns), passed to the reward functions."""
    index: int = 0
    """0-based position of the row in its source."""


@dataclass
class PromptRecord:
    """One prompt ready for rollouts. A batch is ``list[PromptRecord]``."""

    prompt: str
    """The rendered prompt text (chat template and system prompt applied)."""
    prompt_ids: list[int]
    """Token ids of ``prompt`` (at most ``max_prompt_length``)."""
    columns: dict[str, Any]
    """Answer and extra columns, e.g. ``{"answer": "0.5"}``; reward functions receive them as keyword lists."""
    index: int
    """0-based position of the row in its source."""
    position: int | None = None
    """Global position in the stream that served it (set by :class:`~lit_fgrpo.data.streaming.PromptStream`; the
    same on any rank layout), from which the sampling seed derives; ``None`` outside a stream."""
    messages: list[dict[str, str]] | None = None
    """The chat messages ``prompt`` was rendered from (system prompt included), when a chat template rendered it
    whole; ``None`` for plain text and left-truncated prompts; ``[]`` for a row of the ``environment`` source (no
    question: the environment's ``reset()`` gives the first user message, :mod:`lit_fgrpo.data.environment_rows`).
    Multi-turn episodes continue the conversation (:mod:`lit_fgrpo.environments`)."""


def prompt_messages(question: Question, system_prompt: str | None = None) -> list[dict[str, str]]:
    """A question as chat messages, with the system prompt first unless the question brings its own."""
    messages = [{"role": "user", "content": question}] if isinstance(question, str) else [dict(m) for m in question]
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def render_prompt(tokenizer: Any, question: Question, system_prompt: str | None = None) -> str:
    """Prompt text: the tokenizer's chat template with a generation prompt when it has one, plain text otherwise.

    Without a template the system prompt and the message contents are joined by blank lines.
    """
    messages = prompt_messages(question, system_prompt)
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    return "\n\n".join(str(m["content"]) for m in messages)


def render_records(
    examples: Sequence[SourceExample],
    tokenizer: Any,
    max_prompt_length: int,
    too_long: TooLongPolicy = "skip",
    system_prompt: str | None = None,
    source: str = "dataset",
) -> list[PromptRecord]:
    """Render and tokenize examples, applying the too-long policy.

    Templated text is tokenized without special tokens (the template writes them); plain text gets the
    tokenizer's special tokens unless it already starts with the BOS token (as maze prompts do).

    Args:
        examples: Rows from a reader.
        tokenizer: A Hugging Face tokenizer.
        max_prompt_length: Longest prompt in tokens.
        too_long: ``"skip"`` (default) drops a longer prompt and logs a warning with the count; ``"truncate_left"``
            keeps its last ``max_prompt_length`` tokens (the prompt text is re-decoded from them) and logs the
            count; ``"error"`` raises on the first one.
        system_prompt: Optional system message.
        source: Name used in messages.

    Raises:
        DataError: If a prompt is too long under ``"error"``, or every prompt was skipped.
    """
    templated = bool(getattr(tokenizer, "chat_template", None))
    bos = getattr(tokenizer, "bos_token", None)
    texts = [render_prompt(tokenizer, ex.question, system_prompt) for ex in examples]
    adds_special = [not templated and not (bos and text.startswith(bos)) for text in texts]
    token_ids: list[list[int]] = [[] for _ in texts]
    for flag in (True, False):  # one batched call per setting of add_special_tokens
        rows = [i for i, add in enumerate(adds_special) if add is flag]
        if rows:
            encoded = tokenizer([texts[i] for i in rows], add_special_tokens=flag)["input_ids"]
            for i, ids in zip(rows, encoded):
                token_ids[i] = list(ids)
    records: list[PromptRecord] = []
    num_too_long = 0
    for example, text, ids in zip(examples, texts, token_ids):
        messages = prompt_messages(example.question, system_prompt) if templated else None
        if len(ids) > max_prompt_length:
            num_too_long += 1
            if too_long == "error":
                raise DataError(
                    f"{source}: prompt {example.index} has {len(ids)} tokens > {MAX_LENGTH}={max_prompt_length} "
                    f"(raise it, or set {TOO_LONG} to skip or truncate_left)"
                )
            if too_long == "skip":
                continue
            ids = ids[-max_prompt_length:]
            text = tokenizer.decode(ids, skip_special_tokens=False)
            messages = None  # the ids no longer render these messages
        records.append(
            PromptRecord(prompt=text, prompt_ids=ids, columns=example.columns, index=example.index, messages=messages)
        )
    if num_too_long:
        action = "skipped" if too_long == "skip" else "left-truncated"
        log.warning(
            "%s: %d of %d prompts exceed %s=%d tokens and were %s",
            source,
            num_too_long,
            len(examples),
            MAX_LENGTH,
            max_prompt_length,
            action,
        )
    if not records:
        raise DataError(f"{source}: all {len(examples)} prompts exceed {MAX_LENGTH}={max_prompt_length}")
    return records
