"""``PassAtKReport``: held-out pass@k before and after RL, reported through the logger and ``rank_zero_info``.

"Before" is the start-of-run validation of :class:`~lit_fgrpo.callbacks.RolloutCallback` (``validate_at_start``,
logged at step 0); "after" is the last ``val/pass_at_k`` that the module logged in Lightning's validation loop.
At the end of ``fit`` the two are logged as ``final/pass_at_k`` and ``final/start_pass_at_k``, drawn as
``figures/pass_at_k.png`` (pass@k against k on a log axis, :func:`~lit_fgrpo.reporting.pass_at_k_figure`; an
MLflow artifact of the run, or a PNG in the log dir of another logger), and written as a small table to the log,
followed by where the figure went, and saved as ``<default_root_dir>/pass_at_k.json`` (``{"before": {...},
"after": {...}, "step": N}``) for scripts such as ``lit-fgrpo compare``. Rank 0 only. With a
:class:`~lit_fgrpo.callbacks.ConversationWarmStart` that evaluated the base model (``evaluate_base``) the table has
three rows, base model, after the warm start and after RL (and the JSON a ``base`` column).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lit_fgrpo.callbacks.conversation_warm_start import ConversationWarmStart
from lit_fgrpo.callbacks.rollout import RolloutCallback
from lit_fgrpo.reporting.artifacts import log_figure
from lit_fgrpo.reporting.pass_at_k_figure import pass_at_k_figure, pass_at_k_from_metrics
from lit_fgrpo.reporting.run_ending import final_validation_due, resumed_at_end, run_final_validation
from lit_fgrpo.rollout.episodes import TOOL_USE

HELD_OUT = re.compile(rf"^val/((?:ci95_)?pass_at_\d+|{TOOL_USE})$")
"""The metrics this callback reads (logged by the module): ``val/pass_at_<k>``, ``val/ci95_pass_at_<k>`` and, where
the episodes have tools, ``val/tool_use``."""


def _shown(values: dict[str, float]) -> list[str]:
    """The values a table shows, in order: each ``pass_at_<k>`` (k ascending), then the tool-call share."""
    ks = sorted(int(n.removeprefix("pass_at_")) for n in values if re.fullmatch(r"pass_at_\d+", n))
    return [f"pass_at_{k}" for k in ks] + ([TOOL_USE] if TOOL_USE in values else [])


def _cell(values: dict[str, float], name: str) -> str:
    mean, half = values.get(name, math.nan), values.get(f"ci95_{name}")
    text = f"{mean:.3f}" if half is None or math.isnan(half) else f"{mean:.3f} +- {half:.3f}"
    return f"{text:<18}"


def format_report(before: dict[str, float], after: dict[str, float]) -> str:
    """The before/after table, one ``pass_at_k`` per line, each with the half-width of its 95 % interval over the
    held-out questions where known (``ci95_pass_at_<k>``)."""
    intervals = any(name.startswith("ci95_") for name in (*before, *after))
    lines = ["held-out pass@k     " + _cell_title("before RL") + _cell_title("after RL").rstrip()]
    if intervals:
        lines[0] += "   (+- half-width of the 95 % interval over the questions)"
    for name in _shown(before):
        lines.append(f"  {name:<18}{_cell(before, name)}{_cell(after, name)}".rstrip())
    return "\n".join(lines)


def format_stages(stages: list[tuple[str, dict[str, float]]]) -> str:
    """One row per stage (e.g. the base model, after a warm start, after RL), one column per value: pass@k with the
    half-width of its 95 % interval over the questions where known, and the share of episodes with a valid tool
    call (``tool_use``) where the episodes have tools."""
    names = _shown(stages[0][1])
    width = max(len(label) for label, _ in stages) + 2
    lines = [f"held-out{'':<{width - 6}}" + "".join(f"{name:<18}" for name in names).rstrip()]
    lines += [f"  {label:<{width}}" + "".join(_cell(values, n) for n in names).rstrip() for label, values in stages]
    if any(name.startswith("ci95_") for _, values in stages for name in values):
        lines.append("(+- half-width of the 95 % interval over the questions)")
    return "\n".join(lines)


def _cell_title(title: str) -> str:
    return f"{title:<18}"


class PassAtKReport(L.Callback):
    """Report held-out pass@k before and after RL (needs a :class:`RolloutCallback` with ``validate_at_start``).

    Args:
        artifact_file: the figure's name in the run.
        results_file: the JSON file of both columns, relative to ``trainer.default_root_dir`` (None: not written).
    """

    def __init__(
        self, artifact_file: str = "figures/pass_at_k.png", results_file: str | None = "pass_at_k.json"
    ) -> None:
        self.artifact_file = artifact_file
        self.results_file = results_file
        self.after: dict[str, float] = {}
        self.figure_location: str | None = None
        self._validated = False
        """Where the last figure went (``runs:/<id>/figures/pass_at_k.png`` or a file path), None if nowhere."""

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # not on_validation_epoch_end: callbacks run that hook before the module has logged the epoch's values
        if trainer.sanity_checking:
            return
        values = {
            match.group(1): float(value)
            for key, value in trainer.callback_metrics.items()
            if (match := HELD_OUT.match(key))
        }
        if values:
            self.after = values
            self._validated = True

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validated = False

    @override
    def state_dict(self) -> dict[str, Any]:
        # The last validation's values: a run resumed after it (and at its end) reports them as an uninterrupted one.
        return {"after": dict(self.after)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.after = dict(state_dict.get("after", {}))

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Resumed from a checkpoint at the last step: the killed process never ran the validation after it.
        if not self._validated and resumed_at_end(trainer) and final_validation_due(trainer):
            run_final_validation(trainer)
        before: dict[str, float] = {}
        base: dict[str, float] = {}
        for callback in trainer.callbacks:  # type: ignore[attr-defined]  # set by Lightning, undeclared
            if isinstance(callback, RolloutCallback):
                before = callback.start_pass_at_k
            if isinstance(callback, ConversationWarmStart):
                base = callback.base_values
        if trainer.is_global_zero and self.results_file is not None and self.after:
            # Also without a start-of-run validation (validate_at_start: false): "before" is then empty.
            path = Path(trainer.default_root_dir) / self.results_file
            path.parent.mkdir(parents=True, exist_ok=True)
            results = {"before": before, "after": self.after, "step": trainer.global_step} | (
                {"base": base} if base else {}
            )
            path.write_text(json.dumps(results, indent=2))
        if not before or not self.after:
            return
        if trainer.is_global_zero:
            figure = pass_at_k_figure(pass_at_k_from_metrics(before), pass_at_k_from_metrics(self.after))
            self.figure_location = log_figure(trainer.logger, figure, self.artifact_file)
        if base:
            stages = [("base model", base), ("after the warm start", before), ("after RL", self.after)]
            report = format_stages(stages)
        else:
            report = format_report(before, self.after)
        if self.figure_location is not None:
            report += f"\npass@k figure: {self.figure_location}"
        rank_zero_info(report)
        if trainer.logger is not None:
            final = {f"final/{k}": v for k, v in self.after.items()}
            final |= {f"final/start_{k}": v for k, v in before.items()}
            trainer.logger.log_metrics(final, step=trainer.global_step)
