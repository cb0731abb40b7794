"""LightningCLI end to end: every config parses, the tiny maze config runs and logs to a real MLflow store."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_fgrpo.cli import cli_main, main

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
MATH_OVERLAYS = sorted(p for p in (CONFIG_DIR / "math").glob("*.yaml") if p.name != "base.yaml")
MAZE_OVERLAYS = sorted((CONFIG_DIR / "maze").glob("*.yaml"))
SMOLLM2_BASES = ("arith.yaml", "retry.yaml")  # standalone; retry.yaml is the base of the multi-turn overlays
SMOLLM2_OVERLAYS = sorted(p for p in (CONFIG_DIR / "smollm2").glob("*.yaml") if p.name not in SMOLLM2_BASES)
# Every YAML under configs/ is parsed: standalone files alone, overlays after their base.
STACKS = (
    [[c] for c in CONFIGS]
    + [[CONFIG_DIR / "math" / "base.yaml", o] for o in MATH_OVERLAYS]
    + [[CONFIG_DIR / "maze_cpu.yaml", o] for o in MAZE_OVERLAYS]
    + [[CONFIG_DIR / "smollm2" / base] for base in SMOLLM2_BASES]
    + [[CONFIG_DIR / "smollm2" / "arith.yaml", o] for o in SMOLLM2_OVERLAYS]
    + [[CONFIG_DIR / "smollm2" / "retry.yaml", CONFIG_DIR / "smollm2" / "calculator.yaml"]]
)


def _print_config(stack: list[Path], capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    args = ["fit"] + [a for c in stack for a in ("--config", str(c))]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, *extra, "--print_config"])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: "+".join(p.stem for p in s))
def test_every_config_parses(stack: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    printed = _print_config(stack, capsys)
    assert "gamma:" in printed and "\nrollout:\n  engine:" in printed
    assert "${" not in printed  # omegaconf interpolation was resolved


def test_every_yaml_is_covered() -> None:
    covered = {p for stack in STACKS for p in stack}
    # configs/experiments/ holds maze-sweep settings, parsed by tests/experiments/test_evidence_configs.py, and
    # configs/compare/ `lit-fgrpo compare` settings, parsed by tests/experiments/test_compare_runs.py
    sweeps = set((CONFIG_DIR / "experiments").glob("*.yaml")) | set((CONFIG_DIR / "compare").glob("*.yaml"))
    assert set(CONFIG_DIR.rglob("*.yaml")) - sweeps == covered


@pytest.mark.parametrize(
    ("overlay", "gamma", "loss_type"),
    [("grpo", 0.0, "bnpo"), ("fgrpo", 0.5, "bnpo"), ("dapo", 0.0, "dapo"), ("fdapo", 0.5, "dapo"),
     ("cispo", 0.0, "cispo"), ("fcispo", 1.0, "cispo")],
)  # fmt: skip
def test_math_overlay_sets_method_and_keeps_base(
    overlay: str, gamma: float, loss_type: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    stack = [CONFIG_DIR / "math" / "base.yaml", CONFIG_DIR / "math" / f"{overlay}.yaml"]
    config = yaml.safe_load(_print_config(stack, capsys, "--model.objective.temperature", "0.7"))
    objective = config["model"]["objective"]
    assert (objective["gamma"], objective["loss_type"]) == (gamma, loss_type)
    assert config["data"]["loader"]["prompts_per_step"] == 256  # global prompts per step, paper Table 5
    assert config["model"]["policy"]["save_pretrained_dir"] == f"outputs/math_{overlay}/policy"
    callbacks = {c["class_path"].rsplit(".", 1)[-1]: c.get("init_args", {}) for c in config["trainer"]["callbacks"]}
    assert callbacks["ModelCheckpoint"]["dirpath"] == f"outputs/math_{overlay}/checkpoints"
    # interpolation is resolved after every --config and flag is merged (parser_mode omegaconf+)
    assert config["rollout"]["sampling"]["temperature"] == 0.7


@pytest.mark.parametrize(
    ("overlay", "model", "dynamic"),
    [("grpo", {"objective.gamma": 0.0}, None), ("fgrpo", {"objective.gamma": 0.5}, None),
     ("maxrl", {"objective.gamma": 0.0, "objective.scale_rewards": "none", "objective.group_weight": {"kind": "maxrl"}},
      None),
     ("band", {"objective.gamma": 0.0, "objective.group_weight": {"kind": "band", "low": 0.1, "high": 0.9}}, None),
     ("gspo", {"objective.gamma": 0.0, "objective.loss_type": "gspo", "batching.num_iterations": 2}, None),
     ("dynamic", {"objective.gamma": 0.0}, {"max_rounds": 4, "oversample": 2.0})],
)  # fmt: skip
def test_maze_overlay_sets_method_and_keeps_base(
    overlay: str, model: dict, dynamic: dict | None, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    config = yaml.safe_load(
        _print_config([CONFIG_DIR / "maze_cpu.yaml", CONFIG_DIR / "maze" / f"{overlay}.yaml"], capsys)
    )
    for key, value in model.items():
        group, name = key.split(".")
        got = config["model"][group][name]
        assert (got if not isinstance(value, dict) else {k: got[k] for k in value}) == value, key
    assert (
        config["data"]["loader"]["prompts_per_step"] == 16 and config["model"]["optimizer"]["lr"] == 1.0e-4
    )  # the base's settings
    assert config["model"]["policy"]["save_pretrained_dir"] == f"outputs/maze_{overlay}/policy"
    callbacks = {c["class_path"].rsplit(".", 1)[-1]: c.get("init_args", {}) for c in config["trainer"]["callbacks"]}
    assert callbacks["ModelCheckpoint"]["dirpath"] == f"outputs/maze_{overlay}/checkpoints"
    rollout = config["rollout"]
    assert rollout["sampling"]["n"] == 8
    got_dynamic = rollout.get("dynamic_sampling")
    assert (None if got_dynamic is None else {k: got_dynamic[k] for k in dynamic or {}}) == dynamic


def test_help_shows_docstrings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    assert "--model.objective.gamma" in out and "focal exponent" in out
    assert "--data.loader.prompts_per_step" in out and "Prompts per training step over all ranks" in out
    assert "--data.maze.rows" in out and "Maze cell rows" in out  # the data module's groups, with their docstrings


def test_unknown_loss_type_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["fit", "--config", str(CONFIGS[0].parent / "maze_tiny.yaml"), "--model.objective.loss_type", "ppo"]) == 2
    )
    assert "\nerror: --model.objective.loss_type: expected one of " in "\n" + capsys.readouterr().err


def test_tiny_maze_run_logs_to_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    config = str(CONFIGS[0].parent / "maze_tiny.yaml")
    cli = cli_main(["fit", "--config", config])
    run_id = cli.trainer.logger.run_id  # type: ignore[union-attr]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(run_id)
    keys = set(run.data.metrics)
    expected = {
        "train/loss",
        "train/clip_frac",
        "train/kl",
        "train/entropy",
        "train/tokens_per_s",
        "rollout/reward_mean",
        "rollout/reward_std",
        "rollout/frac_active_groups",
        "rollout/completion_length",
        "rollout/tokens_per_s",
        "rollout/logprob_mismatch",
        "rollout/sync_logprob_delta",
        "focal/weight_mean",
        "focal/weight_min",
        "val/pass_at_1",
        "val/pass_at_8",
        "warm_start/loss",
        "final/pass_at_1",
    }
    assert expected <= keys, expected - keys
    assert not any("@" in key for key in keys)
    assert run.data.params["model.objective.gamma"] == "0.5"
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert "config.yaml" in artifacts and "samples" in artifacts
    policy_dir = tmp_path / "outputs" / "maze_tiny" / "policy"
    AutoModelForCausalLM.from_pretrained(policy_dir)
    assert AutoTokenizer.from_pretrained(policy_dir)("WALL PATH")["input_ids"] == [9, 8]
    assert (tmp_path / "outputs" / "maze_tiny" / "checkpoints" / "last.ckpt").exists()


def test_top_level_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for command in ("fit", "validate", "test", "simulate", "maze-sweep"):
        (line,) = [line for line in lines if line.split()[:1] == [command]]
        assert len(line.split()) > 4  # the command and a sentence


def test_rollout_settings_compose_as_their_own_group(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    base = CONFIG_DIR / "maze_cpu.yaml"
    flags = (
        "--rollout.max_staleness",
        "1",
        "--rollout.engine",
        "hf_copy",
        "--model.objective.importance_correction",
        "token",
    )
    config = yaml.safe_load(_print_config([base], capsys, *flags))
    assert (config["rollout"]["engine"], config["rollout"]["max_staleness"]) == ("hf_copy", 1)
    assert config["rollout"]["sampling"]["n"] == 8 and config["rollout"]["val_samples"] == 256  # the base's
    overlay = yaml.safe_load(_print_config([base, CONFIG_DIR / "maze" / "async.yaml"], capsys))
    assert {k: overlay["rollout"][k] for k in ("engine", "max_staleness")} == {"engine": "hf_copy", "max_staleness": 1}
    assert len((CONFIG_DIR / "maze" / "async.yaml").read_text().splitlines()) <= 15


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [("--rollout.max_stalness", "1", "rollout.max_stalness"), ("--rollout.engine", "vlm", "rollout.engine"),
     ("--rollout.val_samples", "0", "val_samples"), ("--rollout.reward_funcs", "[no_such_reward]", "no_such_reward")],
)  # fmt: skip
def test_a_wrong_rollout_setting_is_one_line(
    flag: str, value: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fit", "--config", str(CONFIG_DIR / "maze_tiny.yaml"), flag, value]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and len(errors) == 1 and named in errors[0], err


def test_two_rollout_sources_are_refused() -> None:
    from lit_fgrpo.callbacks import RolloutCallback
    from lit_fgrpo.cli import with_rollout_callback
    from lit_fgrpo.errors import ConfigError
    from lit_fgrpo.rollout.rollout_settings import RolloutSettings

    listed = RolloutCallback(engine="hf_copy")
    assert with_rollout_callback([listed], None) == [listed]  # a listed one is used when `rollout:` is default
    (built,) = with_rollout_callback([], RolloutSettings(max_staleness=0, val_samples=8))
    assert isinstance(built, RolloutCallback) and built.settings.val_samples == 8
    with pytest.raises(ConfigError, match="given twice"):
        with_rollout_callback([listed], RolloutSettings(val_samples=8))
    with pytest.raises(ConfigError, match="2 RolloutCallbacks"):
        with_rollout_callback([listed, RolloutCallback()], None)
