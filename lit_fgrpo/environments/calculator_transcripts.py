"""Transcripts of the ``calculator`` environment used right, for the supervised warm start; no model needed.

Each transcript is the question, the correct tool call, the tool's result and the final answer::

    [user]      What is 123 * 45? Use a tool to compute it, then reply with just the number.
    [assistant] <tool_call>{"name": "multiply", "arguments": {"a": 123, "b": 45}}</tool_call>
    [tool]      5535
    [assistant] 5535

The result is computed by the environment itself (:class:`~lit_fgrpo.environments.calculator.Calculator`'s tool
method) and written as the episodes write a tool's result (:func:`~lit_fgrpo.environments.tools.render_value`), so a
transcript is the episode a perfect model would have. Two sources of questions:

* :func:`calculator_transcripts`: a run's own training prompts (the ``arithmetic`` source's records, whose
  ``expression`` column is ``"123 * 45"``), so the transcripts ask exactly what RL asks, with the same system prompt
  and instruction, and never a held-out question. ``ConversationWarmStart(generator=...)`` points here.
* :func:`multiplication_transcripts` (and the command below): questions drawn here, written to JSONL::

    python -m lit_fgrpo.environments.calculator_transcripts --out data/calculator.jsonl --count 512
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lit_fgrpo.environments.calculator import Calculator
from lit_fgrpo.environments.tools import render_value
from lit_fgrpo.tasks.arithmetic import ArithmeticQuestion

log = logging.getLogger(__name__)

OPERATOR_TOOLS = {"*": "multiply", "+": "add"}
"""The calculator's tool for each operator it can compute."""

INSTRUCTION = "Use a tool to compute it, then reply with just the number."
"""The user turn's sentence after the question (``configs/smollm2/calculator.yaml``'s instruction)."""

_EXPRESSION = re.compile(r"^\s*(-?\d+)\s*([*+])\s*(-?\d+)\s*$")


def tool_call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """One call in the Hermes format the episodes parse: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': dict(arguments)})}</tool_call>"


def calculator_transcript(prompt: Sequence[Mapping[str, str]], a: int, b: int, operator: str = "*") -> dict[str, Any]:
    """The transcript of one question solved with the calculator.

    Args:
        prompt: The prompt's messages (system prompt, if any, and the user's question).
        a: The first operand.
        b: The second operand.
        operator: ``"*"`` (the ``multiply`` tool) or ``"+"`` (``add``).

    Returns:
        ``{"messages": [...]}``: the prompt, the call, the tool's result, the answer.
    """
    name = OPERATOR_TOOLS[operator]
    result = render_value(getattr(Calculator(), name)(a, b))  # the environment's own tool, as an episode calls it
    return {
        "messages": [
            *(dict(m) for m in prompt),
            {"role": "assistant", "content": tool_call_text(name, {"a": a, "b": b})},
            {"role": "tool", "name": name, "content": result},
            {"role": "assistant", "content": result},
        ]
    }


def parse_expression(expression: str) -> tuple[int, str, int] | None:
    """``"123 * 45"`` -> ``(123, "*", 45)``; ``None`` for anything the calculator cannot do in one call."""
    match = _EXPRESSION.match(str(expression))
    return None if match is None else (int(match[1]), match[2], int(match[3]))


def calculator_transcripts(records: Iterable[Any], limit: int | None = None) -> list[dict[str, Any]]:
    """Transcripts of a run's training prompts: each record's messages, then the calculator used right.

    Args:
        records: Prompt records with chat ``messages`` and an ``expression`` column (the ``arithmetic`` source's).
        limit: At most this many transcripts (``None``: one per usable record).

    Returns:
        ``{"messages": [...]}`` rows; records without messages or with an expression of more than one operation
        are skipped and counted in a log line.
    """
    out: list[dict[str, Any]] = []
    skipped = 0
    for record in records:
        if limit is not None and len(out) >= limit:
            break
        parsed = parse_expression(getattr(record, "columns", {}).get("expression", ""))
        messages = getattr(record, "messages", None)
        if parsed is None or not messages:
            skipped += 1
            continue
        a, operator, b = parsed
        out.append(calculator_transcript(messages, a, b, operator))
    if skipped:
        log.warning(
            "calculator transcripts: skipped %d record(s) without messages or a one-operation expression", skipped
        )
    return out


def multiplication_transcripts(
    count: int,
    min_value: int = 10,
    max_value: int = 999,
    seed: int = 0,
    operators: Sequence[str] = ("*",),
    instruction: str = INSTRUCTION,
    system_prompt: str | None = None,
) -> list[dict[str, Any]]:
    """``count`` distinct questions ``a * b`` (operands drawn uniformly from ``min_value..max_value``), solved.

    The user turn is the ``arithmetic`` source's text (:meth:`ArithmeticQuestion.text`), so a run with the same
    ``--data.arithmetic.instruction`` (and ``--data.prompts.system_prompt``) asks its questions in the same words.

    Raises:
        ValueError: If ``count`` exceeds the distinct questions of the range, or an operator has no tool.
    """
    unknown = [op for op in operators if op not in OPERATOR_TOOLS]
    if unknown or not operators:
        raise ValueError(f"operators must be among {sorted(OPERATOR_TOOLS)}, got {list(operators)}")
    span = max_value - min_value + 1
    if span < 1 or count > span * span * len(set(operators)):
        raise ValueError(f"{count} distinct questions do not fit operands {min_value}..{max_value}")
    rng = random.Random(seed)
    seen: set[ArithmeticQuestion] = set()
    out: list[dict[str, Any]] = []
    while len(out) < count:
        question = ArithmeticQuestion(
            (rng.randint(min_value, max_value), rng.randint(min_value, max_value)), (rng.choice(list(operators)),)
        )
        if question in seen:
            continue
        seen.add(question)
        prompt = [{"role": "system", "content": system_prompt}] if system_prompt else []
        prompt.append({"role": "user", "content": question.text(instruction)})
        a, b = question.operands
        out.append(calculator_transcript(prompt, a, b, question.operators[0]))
    return out


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """One JSON object per line (UTF-8); the parent folder is made."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lit_fgrpo.environments.calculator_transcripts --out FILE [--count N] ...``: write transcripts."""
    parser = argparse.ArgumentParser(description="Write calculator transcripts (JSONL) for the supervised warm start.")
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    parser.add_argument("--count", type=int, default=512, help="transcripts (distinct questions)")
    parser.add_argument("--min-value", type=int, default=10, help="smallest operand")
    parser.add_argument("--max-value", type=int, default=999, help="largest operand")
    parser.add_argument("--operators", nargs="+", default=["*"], choices=sorted(OPERATOR_TOOLS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--instruction", default=INSTRUCTION, help="the sentence after the question")
    parser.add_argument("--system-prompt", default=None, help="a system message before the question")
    args = parser.parse_args(argv)
    try:
        rows = multiplication_transcripts(
            args.count, args.min_value, args.max_value, args.seed, args.operators, args.instruction, args.system_prompt
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {len(rows)} transcripts to {write_jsonl(rows, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
