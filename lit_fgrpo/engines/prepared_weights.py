"""The lean step's projection weights prepared for decoding: packed for oneDNN, optionally in bfloat16.

A decoding step of a few dozen rows reads every weight once and does little arithmetic with it, so on a CPU its time
is the weights' bytes over the memory bandwidth plus the matmuls at the vector units' rate. Two things lower it:

- **Packing.** oneDNN's linear kernel on a weight reordered once into its blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``, what torch's inductor uses for frozen CPU weights) gives the same
  numbers as ``F.linear`` and is faster at these shapes; on SmolLM2-135M's 49,152-row output layer with 16 rows,
  about 2.4x in float32 (measured in ``docs/generation-profile.md``). A reorder is slow (all of SmolLM2's weights:
  a few tenths of a second in bfloat16 on one core, more in float32), so only frozen weights are packed (LoRA's base,
  a frozen output layer): once per run (a frozen weight changed in place is packed again; the engines with a copy of
  their own, whose copy changes at every push, do not pack). A trainable weight changes at every optimizer step; in
  bfloat16 it is only cast (well under 0.1 s for all of SmolLM2's weights), in float32 it is used as it is.
- **bfloat16** (``decode_dtype``): half the bytes, and where the CPU multiplies bfloat16 natively (AVX512-BF16 on AMD
  Zen 4 and Intel Cooper Lake and later, AMX on Sapphire Rapids and later) twice the rate. Each projection's input is
  rounded to bfloat16 and its output returned in float32, ``y = float(bf16(x) · bf16(W)ᵀ)`` (float32 accumulation in
  the kernel); the residual stream, RMSNorm, the rotary embedding, attention and its KV cache, LoRA's adapters
  (``s · (x Aᵀ) Bᵀ`` on the float32 input), the prompts' prefill and the sampler stay float32.

- **Fused projections** (bfloat16 only): projections that read the same input (q/k/v, gate/up) get one copy, their
  weights stacked, and one matmul each step (:meth:`PreparedWeights.get_group`). At a rollout's dozen rows one wide
  bfloat16 matmul beat the separate ones by a quarter or more (``docs/generation-profile.md``); in float32 it gained
  nothing measurable, so float32 keeps the separate copies. The model's own forward (the prefill) calls the
  projections one by one; :meth:`PreparedWeights.swapped_into` answers the first call of a group with the fused
  product and hands the other members their slice of it, so one copy serves both and the prompts see the numbers the
  decoding step sees.

A prepared copy is keyed on the parameter, its storage and its version counter (advanced by every in-place write:
``optimizer.step``, ``copy_``, ``load_state_dict``), so a step never reads weights older than the trainer's.
:meth:`PreparedWeights.release_trainable` drops the copies of trainable weights (the engine's ``sleep`` before the
optimizer step: they would be stale after it, and the step needs the memory).

With bfloat16 the sampled tokens' log-probs are those of the distribution actually sampled from: the behaviour
policy, as a bfloat16 vLLM engine reports them. The trainer's float32 log-probs differ by the rounding; each step logs
the gap as ``rollout/logprob_mismatch``, and ``--model.objective.importance_correction`` corrects for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_fgrpo.errors import ConfigError

log = logging.getLogger(__name__)

DecodeDtype = Literal["float32", "bfloat16", "auto"]
"""The lean step's weights: ``float32`` (the model's own dtype), ``bfloat16``, or ``auto`` (bfloat16 where the
device multiplies it natively, else the model's own)."""

DECODE_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "auto")

_PACKING: dict[torch.dtype, bool] = {}
"""Per dtype, whether oneDNN's packed linear ran and matched ``F.linear`` on a probe in this process."""


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 natively: a CUDA device that supports it, or a CPU with AVX512-BF16 or
    AMX tiles (without them torch emulates bfloat16, slower than float32 itself)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_decode_dtype(
    setting: str, device: torch.device, flag: str = "--rollout.decode_dtype"
) -> torch.dtype | None:
    """The dtype the lean step's projections compute in, or None for the model's own.

    Raises:
        ConfigError: an unknown setting, naming ``flag``.
    """
    if setting not in DECODE_DTYPES:
        raise ConfigError(f"{flag} must be one of {', '.join(DECODE_DTYPES)}; got {setting!r}")
    if setting == "float32" or (setting == "auto" and not native_bf16(device)):
        return None
    return torch.bfloat16


def _packed_linear(x: Tensor, packed: Tensor) -> Tensor:
    flat = x.reshape(-1, x.shape[-1])  # (N, in): the kernel takes rows
    return torch.ops.mkldnn._linear_pointwise(flat, packed, None, "none", [], "").view(*x.shape[:-1], -1)


def packing_works(dtype: torch.dtype) -> bool:
    """Whether oneDNN's packed linear runs here in ``dtype`` and gives ``F.linear``'s numbers (a probe, once per
    process and dtype; a CPU build without oneDNN, or a kernel that errs, keeps ``F.linear``)."""
    if dtype not in _PACKING:
        ok = False
        if torch.backends.mkldnn.is_available():
            try:
                gen = torch.Generator().manual_seed(0)
                x = torch.randn(5, 96, generator=gen).to(dtype)  # (rows, in)
                w = torch.randn(40, 96, generator=gen).to(dtype)  # (out, in)
                got = _packed_linear(x, torch.ops.mkldnn._reorder_linear_weight(w, None)).float()
                want = F.linear(x.float(), w.float())
                ok = bool(torch.allclose(got, want, rtol=2e-2 if dtype != torch.float32 else 1e-5, atol=1e-2))
            except (RuntimeError, AttributeError) as err:  # the op is missing or refuses the dtype on this CPU
                log.debug("oneDNN packed linear unavailable in %s: %s", dtype, err)
        _PACKING[dtype] = ok
    return _PACKING[dtype]


def _lora_adapters(layer: nn.Module) -> list[nn.Module]:
    """A PEFT LoRA layer's adapter projections (its ``lora_A`` / ``lora_B`` dictionaries), else none."""
    found: list[nn.Module] = []
    for name in ("lora_A", "lora_B"):
        adapters = layer._modules.get(name)
        if isinstance(adapters, nn.ModuleDict):
            found += list(adapters.values())
    return found


def _with_bias(run: Callable[[Tensor], Tensor], bias: Tensor | None) -> Callable[[Tensor], Tensor]:
    if bias is None:
        return run
    return lambda x: run(x) + bias


class _GroupCall:
    """The members of a fused group as separate ``x -> x · W_iᵀ`` calls: the first call on an input computes the whole
    group's product, the others take their slice of it; the product is dropped once every member took its slice
    (the prefill of an evaluation batch would otherwise hold one per layer), or when a new input comes."""

    def __init__(self, run: Callable[[Tensor], list[Tensor]], members: int) -> None:
        self.run, self.members = run, members
        self._input: Tensor | None = None
        self._version = -1
        self._parts: list[Tensor] = []
        self._taken: set[int] = set()

    def member(self, index: int) -> Callable[[Tensor], Tensor]:
        def call(x: Tensor) -> Tensor:
            fresh = self._input is x and self._version == x._version and index not in self._taken
            if not fresh:
                self._input, self._version, self._parts, self._taken = x, x._version, self.run(x), set()
            self._taken.add(index)
            part = self._parts[index]
            if len(self._taken) == self.members:
                self.clear()
            return part

        return call

    def clear(self) -> None:
        self._input, self._parts, self._taken = None, [], set()


class PreparedWeights:
    """Projection weights prepared for the lean step, made on first use and again only after the weight changed.

    Args:
        dtype: the dtype the projections compute in (None: the weight's own).
        pack: use oneDNN's packed linear for frozen weights (where it works here).
        fuse: see :attr:`fuse`.
    """

    def __init__(self, dtype: torch.dtype | None, pack: bool = True, fuse: bool = True) -> None:
        self.dtype = dtype
        self.pack = bool(pack)
        self.fuse = bool(fuse)
        """Multiply projections that share their input as one where it pays (:attr:`fuses`); False: the separate
        copies (``benchmarks/bench_generation.py`` compares the two)."""
        self._held: dict[int, tuple[Tensor, int, int, Tensor, Callable[[Tensor], Tensor]]] = {}
        self._groups: dict[tuple[int, ...], tuple[tuple[Tensor, ...], tuple[int, ...], Tensor, Callable[..., Any]]] = {}
        self.prepared = 0
        """How many copies were made (a frozen weight counts once per run)."""

    def get(self, weight: Tensor) -> Callable[[Tensor], Tensor] | None:
        """``x -> x · weightᵀ`` (no bias) computed the prepared way, output in ``x``'s dtype; None where ``F.linear``
        on the weight itself is what this would do (a trainable weight kept in its own dtype)."""
        dtype = self.dtype or weight.dtype
        cast = dtype != weight.dtype
        key, ptr, version = id(weight), weight.data_ptr(), weight._version
        held = self._held.get(key)
        if held is not None and held[0] is weight and held[1] == ptr and held[2] == version:
            return held[4]
        # Every call of a run takes the same kernel for a weight (a resumed run must draw what the straight run drew)
        pack = self.pack and not weight.requires_grad and packing_works(dtype)
        if not cast and not pack:
            return None
        copy = weight.detach().to(dtype)  # (out, in)
        if pack:
            copy = torch.ops.mkldnn._reorder_linear_weight(copy, None)

            def run(x: Tensor, w: Tensor = copy) -> Tensor:
                return _packed_linear(x.to(w.dtype), w).to(x.dtype)
        else:

            def run(x: Tensor, w: Tensor = copy) -> Tensor:
                # as rows: a 3-D bfloat16 input would make torch copy the transposed weight into a batch of one
                flat = x.reshape(-1, x.shape[-1]).to(w.dtype)  # (N, in)
                return F.linear(flat, w).to(x.dtype).view(*x.shape[:-1], -1)

        self._held[key] = (weight, ptr, version, copy, run)  # the weight is held too, so that its id stays its own
        self.prepared += 1
        return run

    @property
    def fuses(self) -> bool:
        """Whether projections that share their input are multiplied as one (:meth:`get_group`): in bfloat16."""
        return self.fuse and self.dtype == torch.bfloat16

    def get_group(self, weights: Sequence[Tensor]) -> Callable[[Tensor], list[Tensor]] | None:
        """``x -> [x · W_1ᵀ, x · W_2ᵀ, ...]`` through one prepared copy of the stacked weights (one matmul; the
        outputs are views of its columns), or None where this does not fuse (:attr:`fuses`).

        The weights must have the same input size; like :meth:`get`, the copy is made again only after one of them
        changed, and packed when every one of them is frozen.
        """
        if not self.fuses or len(weights) < 2:
            return None
        dtype = self.dtype or weights[0].dtype
        key = tuple(id(w) for w in weights)
        stamp = tuple(v for w in weights for v in (w.data_ptr(), w._version))
        held = self._groups.get(key)
        if held is not None and all(a is b for a, b in zip(held[0], weights)) and held[1] == stamp:
            return held[3]  # type: ignore[no-any-return]
        pack = self.pack and not any(w.requires_grad for w in weights) and packing_works(dtype)
        copy = torch.cat([w.detach() for w in weights]).to(dtype)  # (sum out, in)
        if pack:
            copy = torch.ops.mkldnn._reorder_linear_weight(copy, None)
        sizes = [int(w.shape[0]) for w in weights]

        def run(x: Tensor, w: Tensor = copy) -> list[Tensor]:
            flat = x.reshape(-1, x.shape[-1]).to(w.dtype)  # (N, in)
            out = _packed_linear(flat, w) if pack else F.linear(flat, w)  # (N, sum out)
            return [part.view(*x.shape[:-1], -1) for part in out.to(x.dtype).split(sizes, dim=-1)]

        self._groups[key] = (tuple(weights), stamp, copy, run)
        self.prepared += 1
        return run

    @contextmanager
    def swapped_into(self, model: nn.Module, groups: Sequence[Sequence[nn.Linear]] = ()) -> Iterator[None]:
        """Within the block, every plain ``nn.Linear`` of ``model`` (a PEFT LoRA layer's base included, its adapters
        not) multiplies through its prepared copy: the model's own forward (the prompts' prefill) runs as the lean
        step does. ``groups``: projections that read the same input (a layer's q/k/v, its gate/up), called in turn
        on it by the model's forward; where this fuses, they share one copy (:meth:`get_group`)."""
        swapped: list[nn.Linear] = []
        calls: list[_GroupCall] = []
        adapters = {id(m) for layer in model.modules() for m in _lora_adapters(layer)}  # they stay float32
        try:
            for group in groups:
                run_group = self.get_group([m.weight for m in group])
                if run_group is None:
                    continue
                call = _GroupCall(run_group, len(group))
                calls.append(call)
                for index, member in enumerate(group):
                    member.forward = _with_bias(call.member(index), member.bias)  # type: ignore[method-assign,assignment]
                    swapped.append(member)
            done = {id(m) for m in swapped}
            for module in model.modules():
                if type(module) is not nn.Linear or id(module) in adapters or id(module) in done:
                    continue
                run = self.get(module.weight)
                if run is None:
                    continue
                module.forward = _with_bias(run, module.bias)  # type: ignore[method-assign,assignment]
                swapped.append(module)
            yield
        finally:
            for module in swapped:
                del module.forward  # the class's forward again
            for call in calls:
                call.clear()

    def release_trainable(self) -> None:
        """Drop the copies of weights that train (they go stale at the next optimizer step); frozen ones stay."""
        self._held = {k: v for k, v in self._held.items() if not v[0].requires_grad}
        self._groups = {k: v for k, v in self._groups.items() if not any(w.requires_grad for w in v[0])}

    def held_bytes(self) -> int:
        """Bytes the kept copies take (the packed layout's own size)."""
        copies = [held[3] for held in self._held.values()] + [group[2] for group in self._groups.values()]
        return sum(copy.numel() * copy.element_size() for copy in copies)


__all__ = ["DECODE_DTYPES", "DecodeDtype", "PreparedWeights", "native_bf16", "packing_works", "resolve_decode_dtype"]
