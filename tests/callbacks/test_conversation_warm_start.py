"""``ConversationWarmStart`` as a phase of ``fit`` (issue 49): before RL, on the run's own training prompts, logged,
resumed, skipped when done; and ``configs/smollm2/tools.yaml`` parses on top of its base configs.

References: the generator's transcripts rendered with the episodes' chat turns; the weights a finished warm start
saved; the merged config's values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.loggers import Logger
from typing_extensions import override

from lit_fgrpo.callbacks import RolloutCallback
from lit_fgrpo.callbacks.conversation_warm_start import ConversationWarmStart
from lit_fgrpo.callbacks.pass_at_k_report import format_stages
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.rollout.episodes import TOOL_USE
from tests.rollout.multiturn_setup import CHAT_MODEL, arithmetic_data, chat_module, rollout_settings, sampling
from tests.training.tiny_setup import quiet_trainer

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "smollm2"
GENERATOR = "lit_fgrpo.environments.calculator_transcripts:calculator_transcripts"


class Recorder(Logger):
    """A logger that keeps every logged metric."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    @override
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.append((step, dict(metrics)))

    @override
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def fit(
    tmp: Path, max_steps: int, warm: ConversationWarmStart | None, *extra: Any, **settings: Any
) -> tuple[Any, Recorder]:
    rollout = RolloutCallback(
        **rollout_settings(environment="calculator", reward_funcs=["last_number"], max_episode_tokens=32) | settings
    )
    logger = Recorder()
    callbacks = [rollout, *extra] + ([warm] if warm is not None else [])
    trainer = quiet_trainer(max_steps, callbacks, logger=logger, default_root_dir=str(tmp), log_every_n_steps=1)
    module = chat_module(model_config=CHAT_MODEL | {"max_position_embeddings": 1024})
    data = arithmetic_data(arithmetic={"min_value": 10, "max_value": 99, "operators": ["*"]})
    trainer.fit(module, data)
    return module, logger


def warm(**kwargs: Any) -> ConversationWarmStart:
    settings: dict[str, Any] = dict(generator=GENERATOR, steps=3, batch_size=4, micro_batch_rows=4, lr=1e-2,
                                    held_out=4, log_every=1)  # fmt: skip
    return ConversationWarmStart(**(settings | kwargs))


def test_the_warm_start_runs_before_rl_logs_its_losses_and_is_not_repeated(tmp_path: Path) -> None:
    before = chat_module(model_config=CHAT_MODEL | {"max_position_embeddings": 1024}).policy.state_dict()
    module, logger = fit(tmp_path, 1, warm())
    warm_logs = [(step, m) for step, m in logger.metrics if any(k.startswith("warm_start/") for k in m)]
    assert [step for step, _ in warm_logs] == [-3, -2, -1, 0]  # before RL's step 0
    assert set(warm_logs[0][1]) == {"warm_start/held_out_loss"} and "warm_start/loss" in warm_logs[-1][1]
    assert any("train/loss" in m for _, m in logger.metrics)  # then RL
    state = torch.load(tmp_path / "warm_start" / "state.pt", weights_only=False)
    assert state["step"] == 3 and len(state["losses"]) == 3 and set(state["held_out_losses"]) == {0, 3}
    moved = [n for n, p in state["weights"].items() if not torch.equal(p, before[n.removeprefix("policy.")])]
    assert moved
    # a second fit in the same folder loads the finished warm start instead of training it again
    again, logger = fit(tmp_path, 0, warm())
    assert not any("warm_start/loss" in m for _, m in logger.metrics)
    for name, p in again.policy.named_parameters():
        torch.testing.assert_close(p.detach(), state["weights"][name], rtol=0, atol=0, msg=name)


def held_out_logs(tmp: Path, warm: ConversationWarmStart | None) -> tuple[dict[int, dict[str, float]], list[float]]:
    """The logged held-out values by step (RL's start at 0, the base model's before the warm start) and the first
    RL rollout's lengths, on an engine that holds its own weights."""
    _, logger = fit(tmp, 1, warm, engine="hf_copy", validate_at_start=True, sampling=sampling(n=4, max_tokens=16))
    held_out = {
        step: {k.removeprefix("val/"): v for k, v in m.items()}
        for step, m in logger.metrics
        if step is not None and any(k.startswith("val/") for k in m)
    }
    first = next(m for _, m in logger.metrics if "rollout/completion_length" in m)
    return held_out, [first["rollout/completion_length"], first["rollout/generated_tokens"]]


def test_evaluate_base_is_the_untouched_models_row_and_rl_still_starts_from_the_warm_start(tmp_path: Path) -> None:
    """References: the start-of-run validation of a run without a warm start (same questions, same seeds) for the
    base row; a warm-started run without ``evaluate_base`` for the row after it (the engine, which holds its own
    weights, is pushed the warm-started ones after evaluating the base)."""
    untouched, untouched_rollout = held_out_logs(tmp_path / "untouched", None)
    plain, plain_rollout = held_out_logs(tmp_path / "plain", warm(lr=5e-2))
    callback = warm(lr=5e-2, evaluate_base=True)
    logs, rollout = held_out_logs(tmp_path / "base", callback)
    assert list(untouched) == list(plain) == [0] and list(logs) == [-3, 0]  # the base row before the warm start
    assert {"pass_at_1", "ci95_pass_at_1", TOOL_USE} <= set(untouched[0])
    assert logs[-3] == untouched[0]
    assert callback.base_values == {k: v for k, v in untouched[0].items() if k.startswith(("pass", "ci95", TOOL_USE))}
    assert callback.state_dict()["base_values"] == callback.base_values  # a resumed run reports the same row
    # RL samples from the warm-started weights, not from the base weights the engine held for the base row
    assert logs[0] == plain[0] and rollout == plain_rollout != untouched_rollout


def test_the_three_stage_table_has_one_row_per_stage() -> None:
    base = {"pass_at_1": 0.0, "ci95_pass_at_1": 0.0, "pass_at_4": 0.03125, "tool_use": 0.0}
    warm_started = {"pass_at_1": 0.5, "ci95_pass_at_1": 0.1, "pass_at_4": 0.75, "tool_use": 0.9}
    after = {"pass_at_1": 0.625, "ci95_pass_at_1": 0.08, "pass_at_4": 0.8, "tool_use": 1.0}
    table = format_stages([("base model", base), ("after the warm start", warm_started), ("after RL", after)])
    lines = table.splitlines()
    assert lines[0].split() == ["held-out", "pass_at_1", "pass_at_4", "tool_use"]
    assert lines[1].split() == ["base", "model", "0.000", "+-", "0.000", "0.031", "0.000"]
    assert lines[3].split() == ["after", "RL", "0.625", "+-", "0.080", "0.800", "1.000"]
    assert lines[4].startswith("(+- half-width")


def test_evaluate_base_needs_the_rollout_callback(tmp_path: Path) -> None:
    trainer = quiet_trainer(1, [warm(evaluate_base=True, environment="calculator")], default_root_dir=str(tmp_path))
    module = chat_module(model_config=CHAT_MODEL | {"max_position_embeddings": 1024})
    with pytest.raises(ConfigError, match="ConversationWarmStart.evaluate_base needs a RolloutCallback"):
        trainer.fit(module, arithmetic_data(arithmetic={"min_value": 10, "max_value": 99, "operators": ["*"]}))


def test_transcripts_are_required_and_bad_settings_name_the_callback() -> None:
    with pytest.raises(ConfigError, match="ConversationWarmStart needs transcripts"):
        ConversationWarmStart()
    with pytest.raises(ConfigError, match="ConversationWarmStart.bad_rows must be 'error' or 'skip'"):
        ConversationWarmStart(transcripts="x.jsonl", bad_rows="drop")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ConversationWarmStart.micro_batch_rows must be >= 1"):
        ConversationWarmStart(transcripts="x.jsonl", micro_batch_rows=0)


def test_the_tools_demo_config_parses_on_its_base_configs(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from lit_fgrpo.cli import main

    stack = ["retry.yaml", "calculator.yaml", "tools.yaml"]
    args = ["fit"] + [a for name in stack for a in ("--config", str(CONFIGS / name))]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--print_config"])
    assert exit_info.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    callbacks = {c["class_path"].rsplit(".", 1)[-1]: c.get("init_args", {}) for c in config["trainer"]["callbacks"]}
    warm_start = callbacks["ConversationWarmStart"]
    assert warm_start["generator"] == GENERATOR and warm_start["steps"] > 0 and warm_start["evaluate_base"] is True
    assert config["rollout"]["engine"] == "hf" and config["rollout"]["engine_kwargs"] is None
    assert config["rollout"]["environment"] == "calculator"
    assert config["data"]["arithmetic"]["operators"] == ["*"]
    assert (config["data"]["arithmetic"]["min_value"], config["data"]["arithmetic"]["max_value"]) == (10, 999)
    assert config["trainer"]["default_root_dir"] == "outputs/smollm2_tools"
