"""FGRPOModule: a real optimisation step, reference handling, gamma, loss presets, LoRA and bad input."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_fgrpo.objectives import group_advantages, policy_loss
from tests.training.tiny_setup import run_steps, synthetic_rollout, tiny_module


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_one_step_changes_policy_not_reference() -> None:
    module = tiny_module(beta=0.1, gamma=0.5)
    assert module.reference is not None
    before, ref_before = params(module.policy), params(module.reference)
    trainer = run_steps(module, synthetic_rollout())
    after = params(module.policy)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(ref_before[k], v) for k, v in params(module.reference).items())
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert trainer.callback_metrics["train/kl"] >= 0
    # the reference is not part of the checkpointed state
    assert not any(key.startswith("_reference") for key in module.state_dict())


def test_no_reference_without_kl() -> None:
    assert tiny_module(beta=0.0).reference is None


def test_gamma_changes_the_update_and_gamma_zero_is_grpo() -> None:
    rollout = synthetic_rollout()
    base = tiny_module(gamma=0.0, lr=1e-3)
    focal = tiny_module(gamma=0.5, lr=1e-3)  # the same seeded build: same start
    start = params(base.policy)
    assert all(torch.equal(start[k], v) for k, v in params(focal.policy).items())
    run_steps(base, rollout)
    run_steps(focal, rollout)
    d_base = {k: params(base.policy)[k] - start[k] for k in start}
    d_focal = {k: params(focal.policy)[k] - start[k] for k in start}
    assert any(not torch.allclose(d_base[k], d_focal[k]) for k in start)
    # gamma = 0 is plain GRPO: the advantages are the unweighted group-normalised rewards
    torch.testing.assert_close(
        base.advantages(rollout), group_advantages(rollout.rewards, 0.0, success=rollout.correct), rtol=0, atol=0
    )


def test_training_step_gradient_equals_the_pure_loss() -> None:
    """The module's accumulated gradient equals policy_loss on the whole batch (micro-batching is exact)."""
    from lit_fgrpo.models.logprobs import completion_logprobs

    rollout = synthetic_rollout(P=4, G=4)
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "gspo"):
        module = tiny_module(gamma=0.5, loss_type=loss_type, micro_batch_rows=3, max_grad_norm=None)
        reference = copy.deepcopy(module.policy)
        adv = group_advantages(rollout.rewards, 0.5, success=rollout.correct).reshape(-1)
        logp = completion_logprobs(reference, rollout.input_ids, rollout.attention_mask, 5).logp
        loss, _ = policy_loss(
            logp,
            None,
            adv,
            rollout.completion_mask,
            loss_type,
            module.epsilon,
            module.epsilon_high,
            max_completion_length=5,
        )
        loss.backward()
        pieces = module.backward_on(rollout)
        assert len(pieces) == 6  # 16 rows in micro-batches of 3
        for (name, p), (_, q) in zip(module.policy.named_parameters(), reference.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=f"{loss_type} {name}")


def test_mini_batches_and_iterations_take_several_optimizer_steps() -> None:
    module = tiny_module(mini_batch_prompts=2, num_iterations=2)
    trainer = run_steps(module, synthetic_rollout(P=4))
    assert trainer.global_step == 4  # 2 mini-batches x 2 iterations
    assert trainer.callback_metrics["train/ratio_mean"] > 0


def test_lora_policy_reference_is_the_base_with_adapters_disabled() -> None:
    from lit_fgrpo.models.policy import LoraSettings

    module = tiny_module(beta=0.1, lora=LoraSettings(r=4, alpha=8))
    assert module.reference is None and module.is_lora
    before = params(module.policy)
    run_steps(module, synthetic_rollout())
    after = params(module.policy)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)


def test_save_pretrained_loads_with_transformers(tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    module = tiny_module()
    module.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([[1, 4, 9, 9, 8]])
    torch.testing.assert_close(loaded(ids).logits, module.policy(ids).logits)
    assert AutoTokenizer.from_pretrained(tmp_path)("WALL PATH")["input_ids"] == [9, 8]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"gamma": -0.5}, "--model.objective.gamma"),
        ({"num_iterations": 0}, "--model.batching.num_iterations"),
        ({"loss_type": "ppo"}, "--model.objective.loss_type"),
        ({"mini_batch_prompts": 0}, "--model.batching.mini_batch_prompts"),
        ({"val_pass_at_k": [0]}, "--model.val_pass_at_k"),
    ],
)
def test_bad_settings_name_the_flag(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tiny_module(**kwargs)


def test_missing_rollout_callback_is_a_clear_error() -> None:
    import lightning as L

    module = tiny_module()
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(RuntimeError, match="RolloutCallback"):
        trainer.fit(module, torch.utils.data.DataLoader([0], batch_size=1))


def test_group_weight_replaces_the_focal_weight_and_is_the_one_logged() -> None:
    from lit_fgrpo.objectives import GroupWeight

    rollout = synthetic_rollout(P=4, G=4)  # 1, 2, 3, 1 successes of 4: mu_hat 0.25, 0.5, 0.75, 0.25
    module = tiny_module(gamma=0.0, scale_rewards="none", group_weight=GroupWeight("maxrl"))
    want = group_advantages(rollout.rewards, scale="none", success=rollout.correct, group_weight=GroupWeight("maxrl"))
    torch.testing.assert_close(module.advantages(rollout), want, rtol=0, atol=0)
    # MaxRL with binary rewards and no std division: (r - mean) / mean
    mean = rollout.rewards.mean(dim=1, keepdim=True)
    torch.testing.assert_close(module.advantages(rollout), (rollout.rewards - mean) / mean)
    trainer = run_steps(module, rollout)
    weights = [4.0, 2.0, 4.0 / 3.0, 4.0]  # 1 / mu_hat, every group active
    assert float(trainer.callback_metrics["focal/weight_mean"]) == pytest.approx(sum(weights) / 4)
    assert float(trainer.callback_metrics["focal/weight_min"]) == pytest.approx(4.0 / 3.0)


def test_gamma_and_group_weight_together_name_both_flags() -> None:
    from lit_fgrpo.errors import ConfigError
    from lit_fgrpo.objectives import GroupWeight

    with pytest.raises(
        ConfigError,
        match=r"--model.objective.gamma=0.5 and --model.objective.group_weight \(kind 'band'\) are both set",
    ):
        tiny_module(gamma=0.5, group_weight=GroupWeight("band", low=0.1, high=0.9))


def test_gspo_preset_clips_at_3e4_and_4e4() -> None:
    module = tiny_module(loss_type="gspo")
    assert (module.epsilon, module.epsilon_high) == (3e-4, 4e-4)


def test_group_weight_survives_a_weights_only_checkpoint_load() -> None:
    """Lightning resumes with torch.load(weights_only=True): the hyperparameters must be plain values."""
    import io

    from lit_fgrpo.objectives import GroupWeight

    module = tiny_module(gamma=0.0, group_weight=GroupWeight("band", low=0.1, high=0.9))
    buffer = io.BytesIO()
    torch.save({"hyper_parameters": dict(module.hparams)}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["hyper_parameters"]
    restored = type(module)(**loaded)
    assert restored.applied_group_weight == GroupWeight("band", low=0.1, high=0.9)
