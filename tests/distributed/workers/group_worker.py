"""One rank of a raw gloo group (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment).

group_worker.py gather [--lora]      full weights of an FSDP2-sharded tiny Qwen2 vs the unsharded state dict
group_worker.py fail RANK            RANK raises inside fail_together; every rank must raise with its message
group_worker.py reduce               global_sum / global_nanmean / global_max against the closed form; the logged
                                     rollout statistics of 2 ranks against those of the whole batch in one process
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from lit_fgrpo.distributed import (
    RankFailure,
    fail_together,
    gather_objects,
    global_max,
    global_nanmean,
    global_sum,
    iter_full_weights,
)
from lit_fgrpo.engines.vllm_worker import policy_state_dict
from lit_fgrpo.objectives import GroupAdvantages, GroupWeight, weighted_group_advantages
from lit_fgrpo.rollout.batch import RolloutBatch
from lit_fgrpo.training.step_stats import global_rollout_stats, rollout_stats


def tiny_qwen2(lora: bool) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)  # the same model on every rank, as Lightning's seed_everything gives
    model = AutoModelForCausalLM.from_config(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        settings = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)
        model = get_peft_model(model, settings)
        for name, param in model.named_parameters():
            if "lora_B" in name:  # B starts at 0; make the merged delta non-zero so merging is tested
                torch.nn.init.normal_(param, std=0.5)
    return model


def gather(lora: bool, cuda: bool = False) -> None:
    from torch.distributed.fsdp import fully_shard

    model = tiny_qwen2(lora)
    if cuda:  # bf16 on the GPU, sharded over NCCL (the gpu check runs it with one rank)
        model = model.to("cuda", torch.bfloat16)
    if lora:  # reference: the merged model's checkpoint-format state dict, computed by PEFT itself
        import copy

        reference = {k: v.clone() for k, v in policy_state_dict(copy.deepcopy(model).merge_and_unload()).items()}
    else:
        reference = {k: v.clone() for k, v in policy_state_dict(model).items()}
    base = model.get_base_model() if lora else model
    for layer in base.model.layers:
        fully_shard(layer)
    fully_shard(model)
    some = next(iter(base.model.layers[0].parameters()))
    assert type(some).__name__ == "DTensor", "fully_shard did not shard"
    names = []
    for name, tensor in iter_full_weights(model):
        assert type(tensor).__name__ != "DTensor", name
        expected = reference[name]
        assert tensor.shape == expected.shape, (name, tensor.shape, expected.shape)
        # bf16: PEFT merges in bf16, iter_full_weights in float32 then casts, so they may differ by one bf16 step
        tolerance = {"rtol": 2e-2, "atol": 2e-2} if cuda else {"rtol": 1e-5, "atol": 1e-6}
        torch.testing.assert_close(tensor, expected.to(tensor.device), msg=name, **tolerance)
        names.append(name)
    assert sorted(names) == sorted(reference), sorted(set(names) ^ set(reference))
    assert len(names) == len(set(names))
    print(f"rank {dist.get_rank()}: {len(names)} full tensors match")


def fail(failing_rank: int) -> None:
    with fail_together("a step where nothing fails"):
        pass
    try:
        with fail_together("reward scoring at step 3"):
            if dist.get_rank() == failing_rank:
                raise ValueError("reward function maze crashed on completion 7")
    except RankFailure as err:
        print(f"rank {dist.get_rank()} RankFailure: {err}")
        raise SystemExit(3) from None
    except ValueError as err:
        print(f"rank {dist.get_rank()} ValueError: {err}")
        raise SystemExit(4) from None
    print(f"rank {dist.get_rank()} no failure")


def reduce() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    values = torch.tensor([float(rank + 1)] * (rank + 1) + [float("nan")])  # rank r: r + 1 copies of r + 1
    expected_sum = sum((r + 1) ** 2 for r in range(world))
    expected_mean = expected_sum / sum(r + 1 for r in range(world))  # the count-weighted mean, not mean of means
    assert float(global_sum(torch.nansum(values))) == expected_sum
    assert abs(float(global_nanmean(values)) - expected_mean) < 1e-12
    assert global_max(3 * rank) == 3 * (world - 1)
    rollout_statistics(rank, world)
    print(f"rank {rank}: reductions match")


def toy_rollout(prompts: range) -> tuple[RolloutBatch, GroupAdvantages]:
    """A rollout of the given global prompts (G = 4), deterministic per prompt; and its (P, G) advantages."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, 4, generator=g).round(decimals=1)  # (12, G)
    rewards[0, 1] = rewards[1, 2] = float("nan")  # unscorable rows, one on each rank of 2
    rewards = rewards[list(prompts)]  # (P, G)
    correct = rewards > 0.5  # (P, G)
    grouped = weighted_group_advantages(rewards, GroupWeight("focal", gamma=0.5), "group", correct)
    lengths = torch.randint(1, 9, (12 * 4,), generator=g).view(12, 4)[list(prompts)].reshape(-1)  # (B,)
    mask = (torch.arange(8) < lengths.unsqueeze(1)).float()  # (B, T)
    ids = torch.zeros(mask.shape, dtype=torch.long)
    failed = float(torch.isnan(rewards).sum())
    stats = {"failed_maze": failed, "frac_truncated": float((lengths == 8).float().mean()), "tokens_per_s": 10.0}
    return RolloutBatch(ids, ids, mask, rewards, correct, 8, stats=stats), grouped


def rollout_statistics(rank: int, world: int) -> None:
    """The logged statistics of rank r's strided share equal those of the whole batch (one process's)."""
    whole, whole_adv = toy_rollout(range(12))
    share, share_adv = toy_rollout(range(rank, 12, world))
    expected = rollout_stats(whole.rewards, *whole_adv, whole.completion_mask)
    expected |= {"rollout/failed_maze": 2.0, "rollout/tokens_per_s": 10.0 * world}
    expected["rollout/frac_truncated"] = float((whole.completion_mask.sum(1) == 8).float().mean())
    got = global_rollout_stats(share, share_adv, gather_objects)
    assert got.keys() == expected.keys(), sorted(set(got) ^ set(expected))
    for key, value in expected.items():
        assert abs(got[key] - value) < 1e-6, (key, got[key], value)


def main() -> None:
    cuda = "--cuda" in sys.argv
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=45))
    try:
        command = sys.argv[1]
        if command == "gather":
            gather("--lora" in sys.argv, cuda)
        elif command == "fail":
            fail(int(sys.argv[2]))
        else:
            reduce()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
