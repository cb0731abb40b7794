"""Raw 2-process gloo groups: the FSDP2 full-weight gather, failure propagation and the reductions."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.launch import group_ranks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("lora", [False, True], ids=["plain", "lora"])
def test_fsdp2_gather_yields_the_unsharded_state_dict(lora: bool) -> None:
    results = group_ranks(["gather", "--lora"] if lora else ["gather"])
    for rank, (status, out) in enumerate(results):
        assert status == 0, f"rank {rank}:\n{out[-3000:]}"
        assert "full tensors match" in out


def test_a_failure_on_rank_1_stops_every_rank_with_its_message() -> None:
    (status0, out0), (status1, out1) = group_ranks(["fail", "1"], timeout=60)  # a hang raises TimeoutError
    assert status1 == 4 and "ValueError: reward function maze crashed on completion 7" in out1
    assert status0 == 3, out0[-3000:]
    assert "rank 1 failed in reward scoring at step 3: ValueError: reward function maze crashed on completion 7" in out0


def test_reductions_weight_by_count() -> None:
    for status, out in group_ranks(["reduce"], world=2):
        assert status == 0 and "reductions match" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("lora", [False, True], ids=["plain", "lora"])
def test_fsdp2_gather_on_cuda_bf16(lora: bool) -> None:
    world = min(torch.cuda.device_count(), 2)
    results = group_ranks(["gather", "--cuda", *(["--lora"] if lora else [])], world=world)
    for rank, (status, out) in enumerate(results):
        assert status == 0, f"rank {rank}:\n{out[-3000:]}"
