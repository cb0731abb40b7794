"""FGRPOModule's settings groups: plain hyperparameters, and checkpoints from before the groups (flat) still load."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from lit_fgrpo.errors import ConfigError
from lit_fgrpo.objectives import GroupWeight
from lit_fgrpo.training.module import FGRPOModule
from lit_fgrpo.training.module_settings import FLAT_NAMES, ObjectiveSettings, grouped_settings
from tests.training.tiny_setup import TINY_MODEL, tiny_module

FLAT_HPARAMS: dict[str, Any] = {
    "model": None, "model_config": TINY_MODEL, "tokenizer": "builtin:maze", "gamma": 0.0, "loss_type": "dapo",
    "epsilon": None, "epsilon_high": 0.3, "beta": 0.0, "scale_rewards": "none", "advantage_eps": 1e-6,
    "num_iterations": 2, "mini_batch_prompts": None, "micro_batch_rows": 8, "lr": 1e-3, "weight_decay": 0.0,
    "adam_betas": (0.9, 0.99), "warmup_steps": 0, "max_grad_norm": 1.0, "temperature": 1.0, "lora": None,
    "gradient_checkpointing": False, "logprob_chunk_rows": 64, "importance_correction": "token",
    "importance_cap": 3.0, "skip_zero_advantage": True, "val_pass_at_k": [1, 2], "save_pretrained_dir": None,
    "seed": 3, "group_weight": {"kind": "band", "gamma": 0.0, "low": 0.1, "high": 0.9}, "max_nonfinite_skips": 5,
    "_instantiator": "lightning.pytorch.cli.instantiate_module", "_class_path": "lit_fgrpo.training.module.FGRPOModule",
}  # fmt: skip
"""A checkpoint's ``hyper_parameters`` as FGRPOModule and LightningCLI wrote them before the groups: all 30, flat."""


def assert_same_module(loaded: FGRPOModule, module: FGRPOModule) -> None:
    assert loaded.hparams == module.hparams
    assert loaded.update_settings == module.update_settings
    for (name, want), got in zip(module.policy.state_dict().items(), loaded.policy.state_dict().values()):
        assert torch.equal(want, got), name


def test_every_old_flat_setting_has_one_group() -> None:
    assert set(FLAT_HPARAMS) - set(FLAT_NAMES) == {"val_pass_at_k", "_instantiator", "_class_path"}
    grouped = grouped_settings(FLAT_HPARAMS)
    assert grouped["objective"]["group_weight"]["kind"] == "band" and grouped["optimizer"]["lr"] == 1e-3
    assert grouped["batching"]["num_iterations"] == 2 and grouped["policy"]["seed"] == 3
    with pytest.raises(ConfigError, match="--model.no_such is not a setting"):
        grouped_settings({"no_such": 1})


def test_hyperparameters_are_plain_and_rebuild_the_module() -> None:
    module = tiny_module(gamma=0.0, group_weight=GroupWeight("band", low=0.1, high=0.9), lora={"r": 2})
    buffer = io.BytesIO()
    torch.save({"hyper_parameters": dict(module.hparams)}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)["hyper_parameters"]  # Lightning's resume load
    assert set(saved) == {"policy", "objective", "optimizer", "batching", "val_pass_at_k"}
    rebuilt = FGRPOModule(**saved)
    assert rebuilt.objective == module.objective and rebuilt.lora == module.lora
    assert rebuilt.optimizer_settings.adam_betas == (0.9, 0.999)


@pytest.mark.parametrize("where", ["file", "buffer"])
def test_flat_checkpoint_loads_into_the_groups(tmp_path: Path, where: str) -> None:
    module = FGRPOModule(**grouped_settings(FLAT_HPARAMS))
    assert module.objective == ObjectiveSettings(
        gamma=0.0, loss_type="dapo", epsilon_high=0.3, scale_rewards="none", importance_correction="token",
        group_weight=GroupWeight("band", low=0.1, high=0.9),
    )  # fmt: skip
    _ = module.policy  # built
    checkpoint = {
        "state_dict": module.state_dict(),
        "hyper_parameters": FLAT_HPARAMS,
        "pytorch-lightning_version": "2.6.0",
    }
    path = tmp_path / "old.ckpt"
    torch.save(checkpoint, path)
    source: Any = path if where == "file" else io.BytesIO(path.read_bytes())
    loaded = FGRPOModule.load_from_checkpoint(source)
    assert_same_module(loaded, module)
    assert loaded.hparams["optimizer"]["adam_betas"] == (0.9, 0.99)


def test_grouped_checkpoint_of_the_cli_loads(tmp_path: Path) -> None:
    module = tiny_module(loss_type="cispo", micro_batch_rows=4)
    _ = module.policy  # built
    hparams = dict(module.hparams) | {k: FLAT_HPARAMS[k] for k in ("_instantiator", "_class_path")}
    path = tmp_path / "new.ckpt"
    torch.save(
        {"state_dict": module.state_dict(), "hyper_parameters": hparams, "pytorch-lightning_version": "2.6.0"}, path
    )
    assert_same_module(FGRPOModule.load_from_checkpoint(path), module)
