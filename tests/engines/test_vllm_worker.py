"""merged_lora: the adapters are in the base weights inside the block and out of them after, also after an error."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_fgrpo.engines.vllm_worker import merged_lora, policy_state_dict
from tests.tiny_models import tiny_lm


def test_merged_inside_unmerged_after_even_on_error() -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_lm(vocab=50), LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    reference = {k: v.clone() for k, v in policy_state_dict(copy.deepcopy(model).merge_and_unload()).items()}
    plain = {k: v.clone() for k, v in policy_state_dict(model).items()}
    with merged_lora(model):
        merged = {k: v.clone() for k, v in policy_state_dict(model).items()}
    assert merged.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(merged[name], value, rtol=0, atol=1e-6, msg=name)
    assert any(not torch.equal(merged[n], plain[n]) for n in plain)  # the adapters did change q_proj
    with pytest.raises(RuntimeError, match="mid-push"), merged_lora(model):
        raise RuntimeError("mid-push")
    assert not any(getattr(m, "merged", False) for m in model.modules())
    for name, value in policy_state_dict(model).items():
        torch.testing.assert_close(value, plain[name], rtol=0, atol=1e-6, msg=name)


def test_a_plain_model_is_left_alone() -> None:
    model = tiny_lm(vocab=50)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with merged_lora(model):
        pass
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
