"""``lit-fgrpo plan``: its arithmetic against the real tensors of a tiny policy trained one step on CPU, the 7B
preset's parameter count in closed form, and the one-line refusal of a plan that does not fit.

The 2-rank FSDP2 shard sizes are checked against the plan in ``test_fsdp.py`` (from the sharded run's own tensors).
"""

from __future__ import annotations

import pytest
import torch
from jsonargparse import Namespace

from lit_fgrpo.cli import main
from lit_fgrpo.commands.plan import architecture, plan_run, policy_shapes
from lit_fgrpo.distributed.memory_plan import GIB, PlanSettings, memory_plan, shard_rows
from lit_fgrpo.models.lora import LoraSettings
from lit_fgrpo.models.policy import apply_lora, build_policy
from lit_fgrpo.tasks.registry import load_tokenizer
from tests.training.tiny_setup import MAZE_TINY_MODEL

SEVEN_B = ["--config", "configs/math/base.yaml", "--config", "configs/math/fgrpo.yaml"]
SEVEN_B_ARCH = ["--architecture", "configs/math/qwen2.5-7b.json"]


def _real_bytes(dtype: torch.dtype, lora: LoraSettings | None) -> dict[str, int]:
    """Parameter, gradient and AdamW-moment bytes of the maze_tiny policy after one real backward and step."""
    policy = build_policy(None, MAZE_TINY_MODEL, load_tokenizer("builtin:maze"), seed=0, dtype=dtype)
    if lora is not None:
        policy = apply_lora(policy, lora)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    ids = torch.randint(0, 5, (2, 6))  # (B, T)
    policy(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in trainable if p.grad is not None)
    optimizer.step()
    moments = 0
    for state in optimizer.state.values():
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"} and state["step"].dim() == 0  # step: a host scalar
        moments += sum(state[k].numel() * state[k].element_size() for k in ("exp_avg", "exp_avg_sq"))
    params = sum(p.numel() * p.element_size() for p in policy.parameters())
    return {"parameters": params, "gradients": grads, "AdamW moments": moments}


@pytest.mark.parametrize(
    ("dtype", "lora"),
    [(torch.float32, None), (torch.bfloat16, None), (torch.float32, LoraSettings(r=4, alpha=8))],
    ids=["32-true", "bf16-true", "lora"],
)
def test_the_plan_equals_the_real_tensor_bytes_of_a_tiny_policy(dtype: torch.dtype, lora: LoraSettings | None) -> None:
    model = Namespace(model_config=dict(MAZE_TINY_MODEL), tokenizer="builtin:maze", model=None)
    shapes = policy_shapes(architecture(model, None), lora)  # built on the meta device
    size = torch.finfo(dtype).bits // 8
    plan = memory_plan(shapes, PlanSettings(world=1, sharded=False, ddp=False, param_bytes=size, reference=False))
    real = _real_bytes(dtype, lora)
    assert {name: plan.bytes_of(name) for name in real} == real
    if lora is not None:  # only the adapters train: far fewer gradient bytes than parameter bytes
        assert real["gradients"] < real["parameters"] / 5


def test_a_reference_doubles_the_parameters_and_fsdp2_divides_by_the_world() -> None:
    model = Namespace(model_config=dict(MAZE_TINY_MODEL), tokenizer="builtin:maze", model=None)
    shapes = policy_shapes(architecture(model, None), None)
    one = memory_plan(shapes, PlanSettings(1, False, False, 4, reference=True))
    assert one.bytes_of("reference (beta > 0)") == one.bytes_of("parameters")
    ddp = memory_plan(shapes, PlanSettings(2, False, True, 4, reference=True))
    assert ddp.bytes_of("DDP gradient buckets") == ddp.bytes_of("gradients") == one.bytes_of("gradients")
    sharded = [memory_plan(shapes, PlanSettings(2, True, False, 4, reference=True), rank=r) for r in range(2)]
    for name in ("parameters", "gradients", "AdamW moments", "reference (beta > 0)"):
        assert sum(plan.bytes_of(name) for plan in sharded) == one.bytes_of(name)  # the two halves make the whole
    assert [shard_rows(7, 4, r) for r in range(4)] == [2, 2, 2, 1] and shard_rows(2, 4, 3) == 0  # torch.chunk


def test_the_7b_presets_parameter_count_is_qwen2_5_7b_in_closed_form() -> None:
    hidden, layers, inter, vocab, heads, kv_heads = 3584, 28, 18944, 152064, 28, 4
    kv = hidden // heads * kv_heads  # 512: the k and v projections' width
    attention = hidden * hidden + hidden + 2 * (hidden * kv + kv) + hidden * hidden  # q (+bias), k, v (+bias), o
    layer = attention + 3 * hidden * inter + 2 * hidden  # gate, up, down; two RMSNorms
    expected = 2 * vocab * hidden + layers * layer + hidden  # untied embedding and head, final norm
    assert expected == 7_615_616_512
    shapes = policy_shapes(architecture(Namespace(model=None, model_config=None), SEVEN_B_ARCH[1]), None)
    assert sum(s.numel for s in shapes) == expected  # the meta-device build of the preset's architecture
    run = plan_run([*SEVEN_B, *SEVEN_B_ARCH])  # 2 nodes x 8 GPUs, model_parallel, bf16-true, vLLM at 0.5
    rank0 = sum(shard_rows(s.dim0, 16, 0) * s.rest for s in shapes) * 2
    assert run.plan.bytes_of("parameters") == run.plan.bytes_of("gradients") == rank0
    assert abs(rank0 - expected * 2 / 16) < 2 * 16 * hidden  # 1/16 of 2 B each, up to the ceil of each dim 0
    assert run.plan.bytes_of("AdamW moments") == 2 * rank0
    assert run.plan.bytes_of("reference (beta > 0)") == 0  # the math presets have beta = 0
    assert run.plan.bytes_of("rollout engine") == int(0.5 * 80 * GIB)  # vLLM's gpu_memory_utilization share


def test_a_plan_that_does_not_fit_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # DDP replicates a 7B policy with its gradients, buckets and AdamW moments: ~57 GiB + vLLM's 40 GiB > 80 GiB
    assert main(["plan", *SEVEN_B, *SEVEN_B_ARCH, "--trainer.strategy", "ddp"]) == 2
    captured = capsys.readouterr()
    assert "DDP gradient buckets" in captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lit-fgrpo plan: error: the plan needs "), lines
    assert "more than --gpu_memory_gib 80" in lines[0]


def test_a_missing_architecture_is_one_line_naming_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *SEVEN_B]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--model.policy.model checkpoints/Qwen2.5-7B: no config.json" in line and "--architecture" in line
