"""Global batch shares, the stream's rank layout and layout-independent seeds (no processes needed)."""

from __future__ import annotations

import lightning as L
import pytest

from lit_fgrpo.data import PromptDataModule, PromptRecord, PromptStream
from lit_fgrpo.distributed import per_rank_mini_batch, per_rank_share, prompt_seed
from lit_fgrpo.distributed.rank_layout import _splitmix64


def records(n: int) -> list[PromptRecord]:
    return [PromptRecord(prompt=f"p{i}", prompt_ids=[i], columns={}, index=i) for i in range(n)]


# ---------------------------------------------------------------- seeds
def test_splitmix64_matches_the_reference_generator() -> None:
    # Vigna's splitmix64.c with state 1234567: next() adds the golden gamma, then mixes.
    expected = [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431]
    state, golden = 1234567, 0x9E3779B97F4A7C15
    outputs = []
    for _ in expected:
        outputs.append(_splitmix64(state))
        state = (state + golden) % 2**64
    assert outputs == expected


def test_prompt_seed_is_a_pure_function_of_base_position_step_and_stream() -> None:
    assert prompt_seed(3, 17, 5) == prompt_seed(3, 17, 5)
    seeds = {prompt_seed(0, p, s, stream) for p in range(64) for s in range(8) for stream in range(3)}
    assert len(seeds) == 64 * 8 * 3  # no collisions on a grid where a sum (p + s + stream) collides everywhere
    assert all(0 <= seed < 2**63 for seed in seeds)
    assert prompt_seed(1, 0, 0) != prompt_seed(0, 0, 0)
    with pytest.raises(ValueError, match="position"):
        prompt_seed(0, -1, 0)


@pytest.mark.parametrize("world", [2, 4])
def test_seeds_of_a_global_batch_do_not_depend_on_the_rank_layout(world: int) -> None:
    P, step = 8, 3
    one = PromptStream(records(50), P, seed=1)
    seeds_one = {r.prompt: prompt_seed(0, r.position, step) for r in one.batch(step) if r.position is not None}
    seeds_many = {}
    for rank in range(world):
        stream = PromptStream(records(50), P // world, seed=1, rank=rank, world_size=world)
        seeds_many |= {r.prompt: prompt_seed(0, r.position, step) for r in stream.batch(step) if r.position is not None}
    assert seeds_many == seeds_one and len(seeds_one) == P


# ---------------------------------------------------------------- global batch shares
def test_per_rank_share_divides_or_refuses_with_the_numbers() -> None:
    assert per_rank_share(256, 16, "--data.loader.prompts_per_step") == 16
    assert per_rank_share(4, 1, "--data.loader.prompts_per_step") == 4
    with pytest.raises(ValueError, match=r"--data.loader.prompts_per_step=10 .* world size 4 .* e.g. 8 or 12"):
        per_rank_share(10, 4, "--data.loader.prompts_per_step")
    with pytest.raises(ValueError, match=r"--data.loader.prompts_per_step=2 .* world size 4 .* e.g. 4 or 8"):
        per_rank_share(2, 4, "--data.loader.prompts_per_step")
    assert per_rank_mini_batch(None, 4) is None
    assert per_rank_mini_batch(64, 16) == 4
    with pytest.raises(ValueError, match="--model.batching.mini_batch_prompts=6"):
        per_rank_mini_batch(6, 4)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_global_batch_t_is_the_same_prompts_on_any_layout(world: int) -> None:
    P, n = 12, 40  # 40 records: global batches cross epoch boundaries
    reference = PromptStream(records(n), P, seed=7)
    streams = [PromptStream(records(n), P // world, seed=7, rank=r, world_size=world) for r in range(world)]
    for t in range(8):
        global_batch = reference.batch(t)
        assert [r.position for r in global_batch] == list(range(t * P, (t + 1) * P))
        shares = [stream.batch(t) for stream in streams]
        for rank, share in enumerate(shares):  # the fixed strided slice, records and positions alike
            assert [(r.prompt, r.position) for r in share] == [
                (r.prompt, r.position) for r in global_batch[rank::world]
            ]
        positions = sorted(r.position for share in shares for r in share if r.position is not None)
        assert positions == list(range(t * P, (t + 1) * P))  # disjoint and complete


@pytest.mark.parametrize("world", [2, 4])
def test_local_mini_batches_together_are_the_global_mini_batch(world: int) -> None:
    P, M = 16, 8
    global_batch = PromptStream(records(100), P, seed=3).batch(0)
    shares = [PromptStream(records(100), P // world, seed=3, rank=r, world_size=world).batch(0) for r in range(world)]
    m = per_rank_mini_batch(M, world)
    assert m is not None
    for j in range(P // M):
        union = sorted(r.prompt for share in shares for r in share[j * m : (j + 1) * m])
        assert union == sorted(r.prompt for r in global_batch[j * M : (j + 1) * M])


def test_evaluation_records_carry_their_index_in_the_split() -> None:
    shard = PromptStream(records(7), 2, infinite=False, rank=1, world_size=2)
    assert [[r.position for r in shard.batch(b)] for b in range(shard.num_batches() or 0)] == [[1, 3], [5]]


# ---------------------------------------------------------------- the data module under a multi-rank trainer
def ddp_trainer(devices: int) -> L.Trainer:
    # Constructing the Trainer launches nothing; it only fixes the world size the data module reads.
    return L.Trainer(accelerator="cpu", devices=devices, strategy="ddp", logger=False, enable_progress_bar=False)


def maze_module() -> PromptDataModule:
    return PromptDataModule(
        source="maze", splits={"num_train": 40, "num_val": 4, "num_test": 4, "val_size": 4},
        loader={"prompts_per_step": 8},
    )  # fmt: skip


def test_datamodule_gives_each_rank_its_share_of_the_global_batch() -> None:
    dm = maze_module()
    dm.trainer = ddp_trainer(2)
    batch = next(iter(dm.train_dataloader()))
    assert len(batch) == 4 and [r.position for r in batch] == [0, 2, 4, 6]


def test_datamodule_refuses_a_global_batch_that_does_not_divide() -> None:
    dm = maze_module()
    dm.trainer = ddp_trainer(3)
    with pytest.raises(ValueError, match=r"--data.loader.prompts_per_step=8 .* world size 3"):
        dm.setup("fit")
