"""Issue 25: LoRA settings given as a mapping, a group weight no group can satisfy, an engine option left unused.

The CLI side of each is in the malformed-input corpus (``test_malformed_inputs.py``); these use the public seams
below it: :func:`lit_fgrpo.models.lora.lora_settings`, :meth:`RolloutSettings.check_reachable_groups`,
:func:`lit_fgrpo.objectives.group_weights.weighted_rates` and :func:`lit_fgrpo.rollout.engine_select.build_engine`.
"""

from __future__ import annotations

from typing import Any

import pytest

from lit_fgrpo.engines.base import SamplingConfig
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.models.lora import LoraSettings, lora_settings
from lit_fgrpo.objectives.group_weights import GroupWeight, weighted_rates
from lit_fgrpo.rollout.group_filter import DynamicSampling
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from tests.reliability.test_cli_errors import TINY


def test_lora_mapping_becomes_settings() -> None:
    settings = lora_settings({"r": 4, "alpha": 8, "target_modules": ("q_proj",)})
    assert settings == LoraSettings(r=4, alpha=8, target_modules=["q_proj"])
    assert lora_settings(None) is None


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"r": 0}, "--model.policy.lora.r must be >= 1, got 0"),
        ({"r": 2.5}, "--model.policy.lora.r: expected int, got 2.5"),
        ({"r": True}, "--model.policy.lora.r: expected int"),
        ({"alpha": 0}, "--model.policy.lora.alpha must be > 0, got 0"),
        ({"alpha": float("inf")}, "--model.policy.lora.alpha must be finite"),
        ({"dropout": 1.0}, "--model.policy.lora.dropout must be in [0, 1), got 1.0"),
        ({"dropout": -0.1}, "--model.policy.lora.dropout must be in [0, 1)"),
        ({"target_modules": []}, "--model.policy.lora.target_modules is empty"),
        ({"target_modules": "q_proj"}, "--model.policy.lora.target_modules: expected a list"),
        ({"target_modules": ["q_proj", ""]}, "--model.policy.lora.target_modules[1] must be a module name"),
        ({"rank": 4}, "--model.policy.lora.rank is not a setting"),
        (3, "--model.policy.lora: expected a mapping"),
    ],
)
def test_lora_bad_field_is_one_line_naming_it(value: Any, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        lora_settings(value)
    assert str(caught.value).startswith(named) and "\n" not in str(caught.value)


def test_module_builds_lora_from_a_mapping() -> None:
    """The AttributeError of issue 25: a mapping (YAML, LightningCLI's hparams, a checkpoint) reached apply_lora."""
    from lit_fgrpo.training.module import FGRPOModule

    model = FGRPOModule(policy=TINY["model"]["policy"] | {"lora": {"r": 2, "alpha": 4}})
    assert model.lora == LoraSettings(r=2, alpha=4)
    assert model.hparams["policy"]["lora"]["r"] == 2  # stored as plain data (weights_only checkpoint loads)
    assert any("lora_A" in name for name, _ in model.policy.named_parameters())


def test_lora_targets_absent_from_the_policy_is_one_line() -> None:
    from lit_fgrpo.training.module import FGRPOModule

    model = FGRPOModule(policy=TINY["model"]["policy"] | {"lora": {"target_modules": ["no_such_proj"]}})
    with pytest.raises(ConfigError, match=r"--model.policy.lora.target_modules \['no_such_proj'\] names no module"):
        _ = model.policy


def band(low: float, high: float) -> GroupWeight:
    return GroupWeight("band", low=low, high=high)


@pytest.mark.parametrize(
    ("weight", "group_size", "rates"),
    [
        (band(0.3, 0.45), 4, []),
        (band(0.25, 0.5), 4, []),  # strict bounds: 1/4 and 2/4 are both outside
        (band(0.2, 0.3), 4, [0.25]),
        (band(0.0, 1.0), 2, [0.5]),
        (GroupWeight("maxrl"), 3, [1 / 3, 2 / 3]),
    ],
)
def test_weighted_rates(weight: GroupWeight, group_size: int, rates: list[float]) -> None:
    assert weighted_rates(weight, group_size) == pytest.approx(rates)


@pytest.mark.parametrize("dynamic", [None, DynamicSampling(max_rounds=2)], ids=["plain", "dynamic_sampling"])
def test_unreachable_band_is_refused_naming_both_settings(dynamic: DynamicSampling | None) -> None:
    settings = RolloutSettings(sampling=SamplingConfig(n=4), dynamic_sampling=dynamic)
    with pytest.raises(ConfigError) as caught:
        settings.check_reachable_groups(band(0.3, 0.45))
    message = str(caught.value)
    assert "--model.objective.group_weight band (low=0.3, high=0.45)" in message and "--rollout.sampling.n=4" in message
    assert ("dynamic_sampling would drop every group" in message) == (dynamic is not None)
    RolloutSettings(sampling=SamplingConfig(n=8)).check_reachable_groups(band(0.3, 0.45))  # 3/8 is inside


def test_reachable_weights_pass() -> None:
    settings = RolloutSettings(sampling=SamplingConfig(n=2), dynamic_sampling=DynamicSampling())
    for weight in (GroupWeight("focal", gamma=0.0), GroupWeight("focal", gamma=2.0), GroupWeight("maxrl")):
        settings.check_reachable_groups(weight)


def test_auto_engine_falling_back_to_hf_shows_unused_engine_kwargs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from lit_fgrpo.engines.hf import HFEngine
    from lit_fgrpo.rollout import engine_select as select

    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    model = AutoModelForCausalLM.from_config(config)
    for installed, why in ((False, "vLLM is not installed"), (True, "the HF engine is as fast")):
        monkeypatch.setattr(select, "vllm_available", lambda installed=installed: installed)
        engine = select.build_engine("auto", model, None, eos_token_id=1, gpu_memory_utilization=0.5)
        assert isinstance(engine, HFEngine)
        lines = [line for line in capsys.readouterr().err.splitlines() if "engine_kwargs" in line]
        assert len(lines) == 1, lines
        assert "--rollout.engine_kwargs ['gpu_memory_utilization']" in lines[0] and why in lines[0]
    select.build_engine("auto", model, None, eos_token_id=1)  # no options: nothing to say
    assert "engine_kwargs" not in capsys.readouterr().err


def test_an_engine_context_longer_than_the_policy_is_refused_unless_vllm_would_take_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM refuses a max_model_len above max_position_embeddings at its start, unless RoPE is scaled or
    VLLM_ALLOW_LONG_MAX_MODEL_LEN is set (in the environment, or in a launched server's extra_env)."""
    from transformers import LlamaConfig

    from lit_fgrpo.rollout.engine_select import LONG_CONTEXT_ENV, check_context

    monkeypatch.delenv(LONG_CONTEXT_ENV, raising=False)
    plain = type("Policy", (), {"config": LlamaConfig(max_position_embeddings=64)})()
    scaled_config = LlamaConfig(
        max_position_embeddings=64, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    )
    scaled = type("Policy", (), {"config": scaled_config})()
    check_context(None, plain)
    check_context(64, plain)
    with pytest.raises(ConfigError, match=r"max_model_len 65 is longer than the policy's context \(max_position_"):
        check_context(65, plain)
    for bad in (0, -1, 1.5, True, "64"):
        with pytest.raises(ConfigError, match="--rollout.engine_kwargs.max_model_len must be an integer >= 1"):
            check_context(bad, plain)
    check_context(256, scaled)  # vLLM derives 256 from the factor
    check_context(65, plain, extra_env={LONG_CONTEXT_ENV: "1"})
    monkeypatch.setenv(LONG_CONTEXT_ENV, "1")
    check_context(65, plain)


def test_servers_given_by_url_need_nothing_of_this_machine() -> None:
    from lit_fgrpo.servers.launcher import check_launch_here
    from lit_fgrpo.servers.server_settings import ServerSettings

    check_launch_here(ServerSettings(urls=("http://10.0.0.9:8000",)))  # no core, host or port of ours is asked for
