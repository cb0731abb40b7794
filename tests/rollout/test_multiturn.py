"""Multi-turn episodes in the one rollout path (issue 43): the collector, the update, the schedules, resume.

The tiny chat policy on the HF engine runs ``Parity`` episodes (two replies, "Again." between them). References:
the episode's own tokens (each row is its prompt, then its model and environment tokens as sampled), the policy's
teacher-forced log-probs (the sampling log-probs sit on the model's tokens), the same records collected in two calls
(a rank layout), the gradient with the environment tokens' targets changed (none reaches the update), and an
uninterrupted run (resume).
"""

from __future__ import annotations

import multiprocessing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_fgrpo.callbacks import RNGStateCallback, RolloutCallback
from lit_fgrpo.callbacks.sample_table import sample_rows
from lit_fgrpo.engines.base import Generation, RolloutEngine
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.models.logprobs import completion_logprobs
from lit_fgrpo.objectives import GroupWeight, weighted_group_advantages
from lit_fgrpo.rewards.last_number import last_number_reward
from lit_fgrpo.rollout import RolloutCollector
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.rollout.episodes import TOOL_USE, EpisodeRollouts
from lit_fgrpo.rollout.group_filter import DynamicSampling
from lit_fgrpo.rollout.rollout_settings import RolloutSettings
from lit_fgrpo.rollout.source import RolloutSource
from lit_fgrpo.training.update_handles import TorchCollectives
from tests.environments.tiny_chat import ScriptedModel, chat_tokenizer
from tests.rollout.multiturn_setup import (
    FlakyParity,
    arithmetic_data,
    chat_module,
    records,
    rollout_settings,
)
from tests.rollout.test_source import Consumer
from tests.training.tiny_setup import quiet_trainer, tiny_module


def source(module: Any = None, **kwargs: Any) -> RolloutSource:
    module = module if module is not None else chat_module()
    rollout = RolloutSource(RolloutSettings(**rollout_settings(**kwargs)))
    rollout.bind(Consumer(module.policy, module.tokenizer))
    return rollout


def collect(rollout: RolloutSource, recs: list[Any], step: int = 0) -> RolloutBatch:
    return rollout.collect(recs, rollout.settings.train_sampling(), step, 0)


def environment_positions(batch: RolloutBatch) -> torch.Tensor:
    """(B, T) completion positions the model reads but is not trained on."""
    T = batch.completion_length
    return (batch.attention_mask[:, -T:] == 1) & (batch.completion_mask == 0)


def test_each_episode_is_one_row_with_the_model_tokens_trained_and_the_sampling_logprobs_on_them() -> None:
    module = chat_module()
    batch = collect(source(module), records(2))
    P, G = 2, 4
    assert batch.rewards.shape == (P, G) and batch.input_ids.shape[0] == P * G
    tokenizer = chat_tokenizer()
    width = batch.input_ids.shape[1] - batch.completion_length
    for r in range(P * G):
        prompt, completion = batch.row_prompt_ids[r], batch.completion_ids[r]
        real = batch.input_ids[r][batch.attention_mask[r] == 1].tolist()
        assert real == prompt + completion  # the row is its prompt, then every token after it, as sampled
        assert batch.input_ids[r, width - len(prompt) : width].tolist() == prompt
        conversation = batch.conversations[r]
        turns = sum(m["role"] == "assistant" for m in conversation)
        assert [m["role"] for m in conversation] == ["user", "assistant", "user", "assistant"][: 2 * turns]
        # the environment's tokens ("Again." in its turn markers) are read, not trained
        env = environment_positions(batch)[r, : len(completion)]
        env_text = tokenizer.decode([t for t, e in zip(completion, env.tolist()) if e])
        assert ("Again." in env_text) == (turns == 2)
        expected = float(sum(len(m["content"]) for m in conversation if m["role"] == "assistant") % 2)
        assert batch.rewards.view(-1)[r] == expected  # the environment's get_reward, the default reward
    assert environment_positions(batch).any() and batch.completion_mask.sum() == batch.stats["generated_tokens"]
    with torch.no_grad():
        trainer_logp = completion_logprobs(
            module.policy, batch.input_ids, batch.attention_mask, batch.completion_length
        ).logp  # (B, T)
    assert batch.sampling_logp is not None
    mask = batch.completion_mask
    torch.testing.assert_close(trainer_logp * mask, batch.sampling_logp * mask, atol=1e-4, rtol=0)
    assert float((batch.sampling_logp * (1 - mask)).abs().sum()) == 0.0
    assert batch.max_completion_length == 32  # max_episode_tokens: the row's width, dr_grpo's divisor
    stats = batch.stats
    assert stats["turns_per_episode"] == sum(len(c) for c in batch.conversations) / 2 / (P * G)
    assert stats["environment_errors"] == 0 and "episodes_truncated" in stats and "reward_environment" in stats
    table = sample_rows(batch, step=3, rows=2)
    assert table["conversation"][0].startswith("[user] What is 0 + 1?\n[assistant] ")
    assert table["turns"] == [sum(m["role"] == "assistant" for m in c) for c in batch.conversations[:2]]
    assert table["fault"] == ["", ""]  # healthy episodes


def test_an_episode_depends_on_its_prompt_seed_and_step_only_not_on_the_rank_layout() -> None:
    module = chat_module()
    rollout = source(module)
    whole = collect(rollout, records(4), step=3)
    halves = [collect(rollout, records(2, first), step=3) for first in (0, 2)]
    assert whole.completion_ids == halves[0].completion_ids + halves[1].completion_ids
    torch.testing.assert_close(whole.rewards, torch.cat([h.rewards for h in halves]))
    other_step = collect(rollout, records(4), step=4)
    assert other_step.completion_ids != whole.completion_ids


def test_prompt_sharing_and_length_groups_give_the_whole_rows_log_probs_on_episode_rows() -> None:
    module = chat_module()
    batch = collect(source(module), records(3))
    assert len({tuple(p) for p in batch.row_prompt_ids}) == 3  # G rows per prompt: shared
    args = (module.policy, batch.input_ids, batch.attention_mask, batch.completion_length)
    with torch.no_grad():
        shared = completion_logprobs(*args, share_prompts=True, chunked=True).logp  # (B, T)
        whole = completion_logprobs(*args, share_prompts=False, chunked=False).logp  # (B, T)
    real = batch.attention_mask[:, -batch.completion_length :].bool()
    torch.testing.assert_close(shared[real], whole[real], atol=1e-5, rtol=0)


def test_environment_tokens_reach_the_update_with_zero_weight() -> None:
    """Gradients of one update are unchanged when the environment positions' targets (the sampling log-probs the
    importance weights divide by) are scrambled; the model positions' do change them."""
    module = chat_module(importance_correction="token")
    batch = collect(source(module), records(2))
    env = environment_positions(batch)
    assert env.any() and batch.sampling_logp is not None

    def gradients(rollout: RolloutBatch) -> list[torch.Tensor]:
        module.policy.zero_grad()
        module.policy_update().backward_on(rollout, lambda loss: loss.backward(), TorchCollectives())
        return [p.grad.clone() for p in module.policy.parameters() if p.grad is not None]

    reference = gradients(batch)
    scrambled = batch.sampling_logp.masked_fill(env, -7.0)
    for got, want in zip(gradients(replace(batch, sampling_logp=scrambled)), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    model_scrambled = batch.sampling_logp.masked_fill(batch.completion_mask.bool(), -7.0)
    assert any(
        not torch.equal(g, w) for g, w in zip(gradients(replace(batch, sampling_logp=model_scrambled)), reference)
    )


def test_unscorable_episodes_are_counted_and_left_out_of_mu_hat_and_the_loss() -> None:
    FlakyParity.made = 0  # counted in this process: thread workers (the order of the resets is theirs)
    flaky = source(environment="tests.rollout.multiturn_setup:FlakyParity", environment_isolation="thread")
    batch = collect(flaky, records(3))
    broken = torch.isnan(batch.rewards)  # (3, 4)
    assert int(broken.sum()) == 4  # every third episode made
    assert batch.stats["environment_errors/step"] == 4
    table = sample_rows(batch, step=0, rows=12)
    assert [bool(f) for f in table["fault"]] == broken.view(-1).tolist()  # the reason where a fault made it unscorable
    assert {f for f in table["fault"] if f} == {"step raised RuntimeError: the checker crashed"}
    assert not batch.correct[broken].any()
    assert batch.completion_mask.view(3, 4, -1)[broken].sum() == 0  # no loss on them
    assert batch.stats["environment_errors"] == broken.sum()
    grouped = weighted_group_advantages(batch.rewards, GroupWeight("focal", gamma=0.5), "group", batch.correct)
    for p in range(3):
        valid = ~broken[p]
        expected = batch.correct[p][valid].double().mean()  # over scorable episodes only
        torch.testing.assert_close(grouped.success_rate[p], expected)
        assert (grouped.advantages[p][broken[p]] == 0).all()


def test_a_chat_template_that_cannot_hold_the_turns_stops_before_the_first_step() -> None:
    module = tiny_module()  # the maze tokenizer has no chat template
    rollout = RolloutSource(RolloutSettings(**rollout_settings()))
    rollout.bind(Consumer(module.policy, module.tokenizer))
    with pytest.raises(ConfigError, match="--rollout.environment: multi-turn episodes need a tokenizer with a chat"):
        rollout.build()


SCHEDULES = {
    "sync": {},
    "lora": {},
    "dynamic": {"dynamic_sampling": DynamicSampling(max_rounds=3, on_short="pad")},
    "async": {"engine": "hf_copy", "max_staleness": 1},
}


LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def fit(
    tmp: Path, max_steps: int, ckpt_path: str | None = None, lora: bool = False, **settings: Any
) -> tuple[Any, Any]:
    rollout = RolloutCallback(**rollout_settings(**settings))
    checkpoint = ModelCheckpoint(dirpath=tmp / "ckpt", save_last=True, every_n_train_steps=1, save_top_k=0)
    trainer = quiet_trainer(max_steps, [rollout, RNGStateCallback(), checkpoint])
    module = chat_module(gamma=0.5, importance_correction="token", lora=LORA if lora else None)
    trainer.fit(module, arithmetic_data(), ckpt_path=ckpt_path)
    return module, trainer


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_one_multi_turn_step_on_every_schedule(tmp_path: Path, schedule: str) -> None:
    module, trainer = fit(tmp_path, 2, lora=schedule == "lora", **SCHEDULES[schedule])
    metrics = trainer.callback_metrics
    assert trainer.global_step == 2
    assert 1.0 <= float(metrics["rollout/turns_per_episode"]) <= 2.0
    assert float(metrics["rollout/environment_errors"]) == 0.0
    assert "rollout/episodes_truncated" in metrics and "train/loss" in metrics
    assert not multiprocessing.active_children()  # the environment workers ended with the run
    if schedule == "async":
        assert float(metrics["rollout/staleness"]) == 1.0


@pytest.mark.parametrize("schedule", ["sync", "async"])
def test_resume_matches_the_uninterrupted_multi_turn_run(tmp_path: Path, schedule: str) -> None:
    # lockstep: bit-identical weights need the same rows in each generate call (the engine's log-probs move in the
    # last float bits with the batch, and Adam magnifies that); async episodes sample the same tokens
    # (tests/environments/test_real_model.py)
    settings = SCHEDULES[schedule] | {"episode_schedule": "lockstep"}
    straight, _ = fit(tmp_path / "a", 3, **settings)
    fit(tmp_path / "b", 2, **settings)
    resumed, _ = fit(tmp_path / "b", 3, str(tmp_path / "b" / "ckpt" / "last.ckpt"), **settings)
    initial = chat_module().policy.state_dict()
    moved = False
    for (name, p), (_, q) in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().items()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)
        moved |= not torch.equal(p, initial[name])
    assert moved


class ScriptedEngine(RolloutEngine):
    """An engine whose replies follow a script by turn (:class:`~tests.environments.tiny_chat.ScriptedModel`)."""

    has_own_weights = False

    def __init__(self, *replies: str) -> None:
        self.model = ScriptedModel(lambda question, turn: replies[min(turn, len(replies) - 1)])

    def generate(self, prompt_ids: list[list[int]], sampling: Any, seeds: Any = None) -> Generation:
        rows = self.model(prompt_ids, [sampling.max_tokens] * len(prompt_ids), list(seeds))
        return Generation([r[0] for r in rows], [list(r[1] or []) for r in rows], [r[2] for r in rows])

    def sync_weights(self, model: Any) -> None:
        pass

    def score(self, prompt_ids: Any, completion_ids: Any, temperature: float = 1.0) -> Any:
        raise NotImplementedError


CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.mark.parametrize("environment", ["calculator", "tests.environments.test_driver:TRLStyle"])
def test_tool_calls_run_through_the_collector_with_the_tools_in_the_prompt(environment: str) -> None:
    """The calculator, and a class written for TRL's environment_factory (reset text, a tool, get_reward), unchanged:
    the tools are listed in the system message (the tiny template has no tool syntax), the tool's answer is read
    and not trained, and the final reply is scored."""
    settings = RolloutSettings(
        **rollout_settings(
            environment=environment, reward_funcs=["last_number"], max_turn_tokens=40, max_episode_tokens=96
        ),
    )
    tokenizer = chat_tokenizer()
    episodes = EpisodeRollouts.build(settings, tokenizer, policy=None)
    collector = RolloutCollector(ScriptedEngine(CALL, "It is 5."), tokenizer, [last_number_reward], episodes=episodes)
    (record,) = [r for r in records(3) if r.columns["answer"] == "5"]  # What is 2 + 3?
    batch = collector.collect([record], settings.train_sampling())
    prompt = tokenizer.decode(batch.row_prompt_ids[0])
    assert prompt.startswith("<|im_start|>system\nYou may call one or more functions") and '"name": "add"' in prompt
    assert ("Use the tools." in prompt) == (environment != "calculator")  # TRL's reset text, appended to the question
    assert batch.rewards.tolist() == [[1.0] * 4] and batch.correct.all()
    assert batch.stats["tool_calls/add"] == 4 and batch.stats["tool_calls_invalid"] == 0
    assert batch.stats[TOOL_USE] == 1.0  # every episode made a valid call
    assert batch.conversations[0][1:] == [
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "It is 5."},
    ]
    env = environment_positions(batch)[0]
    env_ids = [t for t, e in zip(batch.completion_ids[0], env.tolist()) if e]
    assert tokenizer.decode(env_ids) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "script",
    [("It is 5.",), ('<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>', "It is 5."), (CALL, "5")],
)
def test_the_tool_use_share_counts_episodes_with_a_valid_call_whatever_their_reward(script: tuple[str, ...]) -> None:
    """A right answer without the tool, or after a call the tool refused, is no tool use; reference: each
    conversation's tool messages that are results, not error messages."""
    settings = RolloutSettings(
        **rollout_settings(
            environment="calculator", reward_funcs=["last_number"], max_turn_tokens=40, max_episode_tokens=96
        ),
    )
    tokenizer = chat_tokenizer()
    episodes = EpisodeRollouts.build(settings, tokenizer, policy=None)
    collector = RolloutCollector(ScriptedEngine(*script), tokenizer, [last_number_reward], episodes=episodes)
    (record,) = [r for r in records(3) if r.columns["answer"] == "5"]
    batch = collector.collect([record], settings.train_sampling())
    used = [any(m["role"] == "tool" and m["content"] == "5" for m in c) for c in batch.conversations]
    assert batch.correct.all()  # every episode ends with the right number
    assert batch.stats[TOOL_USE] == sum(used) / len(used) == float(script[0] == CALL)


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_reward_functions_receive_environments_and_get_reward_is_summed_with_them(isolation: str) -> None:
    """TRL's rules: reward functions get ``environments=``; the environment's ``get_reward`` is another reward source
    at weight 1, summed with ``reward_funcs`` without being listed."""
    rollout = source(reward_funcs=["tests.rollout.multiturn_setup:replies_seen"], environment_isolation=isolation)
    assert rollout.settings.reward_names == ["tests.rollout.multiturn_setup:replies_seen", "environment"]
    batch = collect(rollout, records(2))
    replies = torch.tensor([sum(m["role"] == "assistant" for m in c) for c in batch.conversations], dtype=torch.float)
    parity = torch.tensor(
        [sum(len(m["content"]) for m in c if m["role"] == "assistant") % 2 for c in batch.conversations]
    )
    torch.testing.assert_close(batch.rewards.view(-1), 10 * replies + parity.float())
    rollout.close()
