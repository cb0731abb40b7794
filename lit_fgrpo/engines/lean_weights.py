"""The policy's decoder read as plain tensors, for the HF engine's lean decoding step (:mod:`.lean_step`).

:func:`lean_weights` walks a Llama-, Qwen2- or Qwen3-type causal LM (a PEFT LoRA wrapper included) and returns,
per layer, the tensors one decoding step needs: the norms' weights, the projections as :class:`LeanLinear` (the
live parameter tensors, never copies, so the step always sees the trainer's current weights) and, for LoRA, each
active adapter's ``A``, ``B`` and scale, applied as ``y = x Wᵀ + b + s · (x Aᵀ) Bᵀ``, exactly PEFT's forward.

Anything else returns None and the engine keeps its generic loop (:func:`~lit_fgrpo.engines.decode.sample_rows`):
another architecture, an activation other than SiLU, DoRA or other LoRA variants, ``fan_in_fan_out`` or LoRA biases,
an adapted embedding or output layer.

With :class:`~lit_fgrpo.engines.prepared_weights.PreparedWeights` the base weights are multiplied the prepared way
(oneDNN-packed, optionally bfloat16: :mod:`~lit_fgrpo.engines.prepared_weights`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_fgrpo.engines.prepared_weights import PreparedWeights

LEAN_MODEL_TYPES = ("llama", "qwen2", "qwen3")
"""``config.model_type`` values whose decoder layer the lean step reproduces."""


@dataclass
class LeanLinear:
    """A projection ``y = x Wᵀ + b`` plus the LoRA terms ``s · (x Aᵀ) Bᵀ`` of its active adapters."""

    weight: Tensor
    bias: Tensor | None = None
    lora: list[tuple[Tensor, Tensor, float]] = field(default_factory=list)
    """``(A, B, scale)`` per active adapter: A is (r, in), B is (out, r)."""
    prepared: Callable[[Tensor], Tensor] | None = None
    """``x -> x Wᵀ`` on a prepared copy of ``weight`` (packed, maybe bfloat16), used instead of ``weight``."""

    def __call__(self, x: Tensor) -> Tensor:
        if self.prepared is None:
            out = F.linear(x, self.weight, self.bias)  # (..., out)
        else:
            out = self.prepared(x)  # (..., out)
            if self.bias is not None:
                out = out + self.bias
        for a, b, scale in self.lora:
            out = out + F.linear(F.linear(x, a), b) * scale
        return out


@dataclass
class LeanGroup:
    """Projections that read the same input multiplied as one (:meth:`PreparedWeights.get_group`), each with its own
    bias and LoRA terms added to its slice."""

    parts: list[LeanLinear]
    run: Callable[[Tensor], list[Tensor]]

    def __call__(self, x: Tensor) -> list[Tensor]:
        outs = self.run(x)  # [(..., out_i)]
        for i, part in enumerate(self.parts):
            if part.bias is not None:
                outs[i] = outs[i] + part.bias
            for a, b, scale in part.lora:
                outs[i] = outs[i] + F.linear(F.linear(x, a), b) * scale
        return outs


@dataclass
class LeanLayer:
    """One decoder layer: attention (with Qwen3's per-head q/k norms when present) and the SiLU-gated MLP."""

    input_norm: Tensor
    post_norm: Tensor
    q: LeanLinear
    k: LeanLinear
    v: LeanLinear
    o: LeanLinear
    gate: LeanLinear
    up: LeanLinear
    down: LeanLinear
    q_norm: Tensor | None = None
    k_norm: Tensor | None = None
    qkv: LeanGroup | None = None
    """q, k and v as one matmul, where the prepared weights fuse them."""
    gate_up: LeanGroup | None = None
    """gate and up as one matmul, where the prepared weights fuse them."""


@dataclass
class LeanWeights:
    """What a decoding step needs of the model, plus the modules it borrows (rotary embedding, token embedding)."""

    layers: list[LeanLayer]
    embed: nn.Module
    final_norm: Tensor
    head: LeanLinear
    rotary: nn.Module
    eps: float
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float


def _linear(module: nn.Module, prepared: PreparedWeights | None) -> LeanLinear | None:
    """A plain ``nn.Linear`` or a PEFT LoRA ``Linear`` as a :class:`LeanLinear`; None for anything else."""
    lean = _plain_or_lora(module)
    if lean is not None and prepared is not None:
        lean.prepared = prepared.get(lean.weight)
    return lean


def _group(parts: list[LeanLinear], prepared: PreparedWeights | None) -> LeanGroup | None:
    run = None if prepared is None else prepared.get_group([part.weight for part in parts])
    return None if run is None else LeanGroup(parts, run)


def _base(module: nn.Module) -> nn.Module:
    base = getattr(module, "base_layer", None)
    return base if isinstance(base, nn.Module) else module


def fusable_groups(model: nn.Module) -> list[list[nn.Linear]]:
    """Per decoder layer of a model :func:`lean_weights` reads, the plain ``nn.Linear`` projections that read the
    same input, in the order the model's forward calls them: ``[q, k, v]`` and ``[gate, up]`` (a LoRA layer's base
    layer); none for any other model (:meth:`PreparedWeights.swapped_into`)."""
    wrapper: Any = model
    causal: Any = wrapper.get_base_model() if hasattr(wrapper, "get_base_model") else wrapper
    config = getattr(causal, "config", None)
    decoder = getattr(causal, "model", None)
    if getattr(config, "model_type", None) not in LEAN_MODEL_TYPES or decoder is None:
        return []
    groups: list[list[nn.Linear]] = []
    for block in getattr(decoder, "layers", []):
        attn, mlp = block.self_attn, block.mlp
        for members in ((attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)):
            bases = [_base(m) for m in members]
            if all(type(b) is nn.Linear for b in bases):
                groups.append(bases)  # type: ignore[arg-type]
    return groups


def _plain_or_lora(module: nn.Module) -> LeanLinear | None:
    if type(module) is nn.Linear:
        return LeanLinear(module.weight, module.bias)
    base = getattr(module, "base_layer", None)
    if type(base) is not nn.Linear or not hasattr(module, "lora_A"):
        return None
    m: Any = module
    if m.merged or m.disable_adapters:
        return LeanLinear(base.weight, base.bias)
    if getattr(m, "fan_in_fan_out", False):
        return None
    lora = []
    for name in m.active_adapters:
        if name not in m.lora_A:
            continue
        if name in getattr(m, "lora_variant", {}) or m.use_dora.get(name) or m.lora_bias.get(name):
            return None
        lora.append((m.lora_A[name].weight, m.lora_B[name].weight, float(m.scaling[name])))
    return LeanLinear(base.weight, base.bias, lora)


def _layer(block: Any, prepared: PreparedWeights | None) -> LeanLayer | None:
    attn, mlp = block.self_attn, block.mlp
    fused = prepared is not None and prepared.fuses
    # members of a fused group never get a copy of their own: the group's copy serves them (and the prefill)
    grouped = (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj)
    found = [_linear(m, None if fused and m in grouped else prepared) for m in (attn.q_proj, attn.k_proj,
             attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)]  # fmt: skip
    linears = [lin for lin in found if lin is not None]
    if len(linears) < len(found):
        return None
    q, k, v, o, gate, up, down = linears
    qkv, gate_up = (_group([q, k, v], prepared), _group([gate, up], prepared)) if fused else (None, None)
    if fused and (qkv is None or gate_up is None):
        return None  # pragma: no cover - get_group fuses whenever ``fuses`` holds
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    return LeanLayer(
        input_norm=block.input_layernorm.weight, post_norm=block.post_attention_layernorm.weight,
        q=q, k=k, v=v, o=o, gate=gate, up=up, down=down,
        q_norm=None if q_norm is None else q_norm.weight, k_norm=None if k_norm is None else k_norm.weight,
        qkv=qkv, gate_up=gate_up,
    )  # fmt: skip


def lean_weights(model: nn.Module, prepared: PreparedWeights | None = None) -> LeanWeights | None:
    """The decoder of ``model`` as :class:`LeanWeights`, or None when the lean step cannot reproduce it.

    For models whose every layer caches full attention (:func:`~lit_fgrpo.engines.decode.supports_own_loop`, which
    the caller checks first: a sliding window is not looked for here). With ``prepared`` the projections' base weights
    are multiplied through its copies where it makes one (:attr:`LeanLinear.prepared`).
    """
    wrapper: Any = model
    causal: Any = wrapper.get_base_model() if hasattr(wrapper, "get_base_model") else wrapper
    config = getattr(causal, "config", None)
    decoder = getattr(causal, "model", None)
    if config is None or getattr(config, "model_type", None) not in LEAN_MODEL_TYPES or decoder is None:
        return None
    if getattr(config, "hidden_act", None) != "silu":
        return None
    head = _linear(causal.get_output_embeddings(), prepared)
    if head is None or type(decoder.embed_tokens) is not nn.Embedding or not hasattr(decoder, "rotary_emb"):
        return None
    layers = [_layer(block, prepared) for block in decoder.layers]
    if any(layer is None for layer in layers):
        return None
    attn = decoder.layers[0].self_attn
    return LeanWeights(
        layers=layers,  # type: ignore[arg-type]
        embed=decoder.embed_tokens,
        final_norm=decoder.norm.weight,
        head=head,
        rotary=decoder.rotary_emb,
        eps=float(config.rms_norm_eps),
        heads=int(config.num_attention_heads),
        kv_heads=int(config.num_key_value_heads),
        head_dim=int(attn.head_dim),
        scaling=float(attn.scaling),
    )


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF's RMSNorm (``weight * x / sqrt(mean(x²) + eps)``, computed in float32) over the last dimension."""
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype) * weight


def rotate_half(x: Tensor) -> Tensor:
    """``(x₁, x₂) -> (-x₂, x₁)`` over the halves of the last dimension (the rotary embedding's pairing)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


__all__ = ["LEAN_MODEL_TYPES", "LeanLayer", "LeanLinear", "LeanWeights", "lean_weights", "rms_norm", "rotate_half"]
