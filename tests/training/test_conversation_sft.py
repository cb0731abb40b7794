"""The conversation warm start (issue 49): loss on the assistant's tokens only, resume, LoRA, settings.

References: a whole-row forward of each transcript assembled by hand (prompt, reply tokens, the tool's turn) with a
mask written from that assembly; an uninterrupted run (resume); the base weights (LoRA).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lit_fgrpo.environments.calculator_transcripts import calculator_transcript
from lit_fgrpo.errors import ConfigError
from lit_fgrpo.models.lora import LoraSettings, apply_lora
from lit_fgrpo.training.conversation_batches import micro_batches, pack_rows, shared_start, step_rows
from lit_fgrpo.training.conversation_sft import (
    ConversationSFTSettings,
    conversation_warm_start,
    rate_factor,
    token_loss_sum,
)
from lit_fgrpo.training.conversation_sft_state import STATE_FILE
from tests.environments.tiny_chat import chat_tokenizer
from tests.training.conversation_setup import calculator_turns, chat_policy, pad_id, transcripts

PROMPT = [{"role": "user", "content": "What is 123 * 45? Use a tool to compute it, then reply with just the number."}]


def by_hand(a: int, b: int) -> tuple[list[int], list[int]]:
    """A transcript's ids and loss mask assembled from the tokenizer and the chat turns, piece by piece."""
    turns, tokenizer = calculator_turns(), chat_tokenizer()
    eot = turns.end_of_turn_id
    messages = calculator_transcript([{**PROMPT[0], "content": f"What is {a} * {b}? Go."}], a, b)["messages"]
    call = tokenizer(messages[1]["content"], add_special_tokens=False)["input_ids"] + [eot]
    answer = tokenizer(str(a * b), add_special_tokens=False)["input_ids"] + [eot]
    prompt = turns.prompt_ids(messages[:1])
    tool = turns.suffix_ids([messages[2]])
    return prompt + call + tool + answer, [0] * len(prompt) + [1] * len(call) + [0] * len(tool) + [1] * len(answer)


def reference_loss_sum(policy: torch.nn.Module, ids: list[int], mask: list[int]) -> torch.Tensor:
    logits = policy(input_ids=torch.tensor([ids])).logits[0, :-1]  # (L-1, V)
    token_loss = F.cross_entropy(logits.float(), torch.tensor(ids[1:]), reduction="none")  # (L-1,)
    return (token_loss * torch.tensor(mask[1:], dtype=torch.float32)).sum()


def test_the_loss_is_the_assistant_tokens_cross_entropy_with_the_shared_prompt_run_once() -> None:
    from lit_fgrpo.environments.transcripts import render_transcript

    turns = calculator_turns()
    pairs = [(123, 45), (67, 890), (12, 34)]
    rows = [
        render_transcript(
            turns, calculator_transcript([{**PROMPT[0], "content": f"What is {a} * {b}? Go."}], a, b)["messages"]
        )
        for a, b in pairs
    ]
    hand = [by_hand(a, b) for a, b in pairs]
    assert [(r.ids, [0] * len(r.prompt_ids) + r.loss_mask) for r in rows] == hand
    assert shared_start(rows) > 600  # the system prompt listing the tools, run once for the three
    policy = chat_policy()
    loss = token_loss_sum(policy, rows, pad_id())
    (grad,) = torch.autograd.grad(loss, [policy.model.embed_tokens.weight])
    reference = sum(reference_loss_sum(policy, ids, mask) for ids, mask in hand)
    (ref_grad,) = torch.autograd.grad(reference, [policy.model.embed_tokens.weight])
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-4)
    # Relative to the gradient's largest entry (about 28 here): the shared-prompt pass sums in another order, and an
    # entry near 0 can differ by a few float32 ulps of the large ones (measured 2.1e-7 of the largest on an AMD EPYC,
    # where atol 1e-6 failed); a wrong mask or position would differ by the size of the gradient itself.
    assert float((grad - ref_grad).abs().max()) <= 1e-5 * float(ref_grad.abs().max())


def test_pack_rows_right_pads_the_rest_and_masks_only_trained_positions() -> None:
    rows = transcripts(3)
    input_ids, attention, loss_mask, T = pack_rows(rows, pad_id())
    start = input_ids.shape[1] - T
    for r, row in enumerate(rows):
        n = len(row.ids)
        assert input_ids[r, :n].tolist() == row.ids and attention[r].sum() == n
        assert loss_mask[r].sum() == row.trained_tokens
        assert loss_mask[r, : n - start].tolist() == ([0] * len(row.prompt_ids) + row.loss_mask)[start:]


def test_the_order_is_a_function_of_the_step_covering_every_transcript_once_per_pass() -> None:
    rows = [i for step in range(5) for i in step_rows(step, 4, 10, seed=3)]
    assert sorted(rows[:10]) == list(range(10)) and sorted(rows[10:20]) == list(range(10))
    assert step_rows(3, 4, 10, seed=3) == rows[12:16] and step_rows(3, 4, 10, seed=4) != rows[12:16]


def test_micro_batches_by_tokens_match_a_loop() -> None:
    gen = torch.Generator().manual_seed(4)
    for _ in range(50):
        n = int(torch.randint(0, 12, (1,), generator=gen))
        rows = torch.randperm(30, generator=gen)[:n].tolist()
        lengths = torch.randint(1, 60, (n,), generator=gen).tolist()
        size, budget = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(10, 150, (1,), generator=gen))
        expected: list[list[int]] = []  # reference: extend the open run while it stays within both limits
        for row, length in zip(rows, lengths, strict=True):
            run_lengths = [lengths[rows.index(r)] for r in expected[-1]] if expected else []
            if expected and len(expected[-1]) < size and (len(run_lengths) + 1) * max(run_lengths + [length]) <= budget:
                expected[-1].append(row)
            else:
                expected.append([row])
        assert micro_batches(rows, size, lengths, budget) == expected
    assert micro_batches([3, 1, 2], 2) == [[3, 1], [2]]  # rows only


def run(policy: torch.nn.Module, steps: int = 4, state: Path | None = None, **kwargs: object) -> object:
    settings = ConversationSFTSettings(
        **({"steps": steps, "batch_size": 4, "micro_batch_rows": 2, "lr": 1e-2, "held_out": 0} | kwargs)  # type: ignore[arg-type]
    )
    return conversation_warm_start(policy, transcripts(10), transcripts(2, seed=9), settings, pad_id(), state,
                                   progress_mode="off")  # fmt: skip


class Killed(Exception):
    pass


def test_a_killed_warm_start_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    whole = chat_policy()
    result = run(whole, checkpoint_every=2)
    policy = chat_policy()

    def kill_at_3(step: int, values: dict[str, float]) -> None:
        if step == 3:
            raise Killed

    settings = ConversationSFTSettings(steps=4, batch_size=4, micro_batch_rows=2, lr=1e-2, held_out=0,
                                       checkpoint_every=2, log_every=1)  # fmt: skip
    with pytest.raises(Killed):
        conversation_warm_start(policy, transcripts(10), transcripts(2, seed=9), settings, pad_id(), tmp_path,
                                kill_at_3, progress_mode="off")  # fmt: skip
    assert torch.load(tmp_path / STATE_FILE, weights_only=False)["step"] == 2
    resumed_policy = chat_policy(seed=5)  # other weights: the state's replace them
    resumed = run(resumed_policy, state=tmp_path, checkpoint_every=2)
    assert resumed.resumed_from == 2 and resumed.losses == result.losses  # type: ignore[attr-defined]
    for (name, a), b in zip(whole.named_parameters(), resumed_policy.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    again = chat_policy(seed=6)
    finished = run(again, state=tmp_path, checkpoint_every=2)
    assert finished.resumed_from == 4  # type: ignore[attr-defined]
    torch.testing.assert_close(dict(again.named_parameters()), dict(whole.named_parameters()), rtol=0, atol=0)
    other = run(chat_policy(), state=tmp_path, lr=2e-2, steps=1)  # other settings: starts over, not resumed
    assert other.resumed_from == 0  # type: ignore[attr-defined]


def test_lora_trains_the_adapters_only_and_the_held_out_loss_falls() -> None:
    policy = apply_lora(chat_policy(), LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    logged: list[tuple[int, dict[str, float]]] = []
    settings = ConversationSFTSettings(steps=6, batch_size=4, micro_batch_rows=4, lr=2e-2, held_out=2,
                                       log_every=3)  # fmt: skip
    result = conversation_warm_start(policy, transcripts(10), transcripts(2, seed=9), settings, pad_id(),
                                     on_log=lambda s, v: logged.append((s, v)), progress_mode="off")  # fmt: skip
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert [s for s, _ in logged] == [0, 3, 6] and set(logged[-1][1]) == {"loss", "held_out_loss"}
    assert result.held_out_losses[6] < result.held_out_losses[0]
    assert len(result.losses) == 6 and result.losses[-1] < result.losses[0]


def test_settings_are_checked_in_one_line_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"^ConversationWarmStart.batch_size must be >= 1, got 0$"):
        ConversationSFTSettings(batch_size=0)
    with pytest.raises(ConfigError, match=r"ConversationWarmStart.lr must be finite and > 0"):
        ConversationSFTSettings(lr=float("nan"))
    with pytest.raises(ConfigError, match=r"^ConversationWarmStart.micro_batch_tokens must be >= 1 or null, got 0$"):
        ConversationSFTSettings(micro_batch_tokens=0)
    with pytest.raises(ConfigError, match=r"ConversationWarmStart.schedule must be 'constant' or 'cosine'"):
        ConversationSFTSettings(schedule="linear")  # type: ignore[arg-type]
    cosine = ConversationSFTSettings(steps=10, warmup_steps=2)
    assert [round(rate_factor(s, cosine), 3) for s in (0, 1, 2, 6, 10)] == [0.333, 0.667, 1.0, 0.5, 0.0]
