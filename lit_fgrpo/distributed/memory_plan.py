"""The memory plan of a run, per rank, from the policy's parameter shapes: pure arithmetic, no torch.

What one rank holds on its GPU for a given strategy, world size (``devices x num_nodes``) and precision:

* **parameters**: every parameter of the policy (LoRA adapters included) at ``param_bytes`` each (2 under
  ``bf16-true``/``16-true``, 4 under ``32-true`` and the ``-mixed`` precisions, whose weights stay fp32);
* **gradients**: the trainable parameters only (all of them, or only the LoRA adapters), in the parameters' dtype;
* **AdamW moments**: ``exp_avg`` and ``exp_avg_sq`` per trainable parameter, in the parameters' dtype (torch's AdamW
  keeps its states in the parameter's dtype: under ``bf16-true`` no fp32 master copy exists, so none is counted;
  its per-tensor ``step`` scalars live on the host and are left out);
* **DDP gradient buckets**: DDP's reducer keeps its own flat copy of the gradients (``gradient_as_bucket_view``
  is off in Lightning's default), as large again as the gradients;
* **reference**: the frozen KL reference (only with ``beta > 0`` and no LoRA: with LoRA the reference is the base
  with the adapters disabled, no extra copy), sharded like the policy unless ``shard_reference`` is off;
* **engine**: a colocated vLLM engine takes ``gpu_memory_utilization`` of the GPU (its weights and KV cache live
  inside that share), or its weights plus ``kv_cache_memory_bytes`` when that is given; an HF engine that samples
  with a full unsharded copy (``hf_copy``; ``hf`` under FSDP2) takes the copy's bytes; ``vllm_server`` nothing.

Under FSDP2 (``model_parallel``) every parameter tensor is split along dim 0 in ``world`` chunks of
``ceil(dim0 / world)`` rows (:func:`shard_rows`); rank 0 holds the largest piece, which is what is printed. DDP and
one process replicate everything. Activations are not included (they depend on the micro-batch and the sequence
length); neither are FSDP2's transiently all-gathered layers, the CUDA context or allocator fragmentation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GIB = 1024**3

ACTIVATIONS_NOTE = (
    "not included: activations (with gradient checkpointing the saved layer inputs alone are layers x rows x\n"
    "  tokens x hidden x param bytes per micro-batch, plus one recomputed layer and one 256 MiB chunk of fp32\n"
    "  logits), FSDP2's gathered layers, the CUDA context"
)


@dataclass(frozen=True)
class TensorShape:
    """One parameter tensor of the policy."""

    dim0: int
    """Its first dimension (the one FSDP2 shards)."""
    rest: int
    """The product of its other dimensions (1 for a vector)."""
    trainable: bool
    """Whether it receives gradients and optimizer states."""

    @property
    def numel(self) -> int:
        """Its number of elements."""
        return self.dim0 * self.rest


@dataclass(frozen=True)
class EngineShare:
    """The rollout engine's memory on a rank's GPU."""

    budget_bytes: int
    """What the engine takes on the GPU (counted in the total)."""
    weight_bytes: int
    """Of which the engine's weights (inside the budget)."""
    note: str
    """How the budget was found."""


@dataclass(frozen=True)
class PlanSettings:
    """The run settings the plan depends on."""

    world: int
    """Ranks: ``devices x num_nodes``."""
    sharded: bool
    """FSDP2 (``model_parallel``): parameters, gradients and optimizer states split over the ranks."""
    ddp: bool
    """DDP over several ranks (gradient buckets counted)."""
    param_bytes: int
    """Bytes per parameter element (2 for ``bf16-true``, 4 for ``32-true``)."""
    reference: bool
    """A frozen KL reference exists (``beta > 0`` and no LoRA)."""
    shard_reference: bool = True
    """Under FSDP2: the reference is sharded like the policy."""


@dataclass
class MemoryPlan:
    """Bytes per rank, line by line (rank 0, the largest shard under FSDP2)."""

    rows: list[tuple[str, int, str]] = field(default_factory=list)
    """(what, bytes, how) for each line."""

    @property
    def total_bytes(self) -> int:
        """The sum of the lines."""
        return sum(size for _, size, _ in self.rows)

    def bytes_of(self, what: str) -> int:
        """The bytes of the line named ``what`` (0 when there is none)."""
        return sum(size for name, size, _ in self.rows if name == what)

    def render(self, header: str, gpu_bytes: int) -> str:
        """The plan as a table, with its total against ``gpu_bytes`` and the note on activations."""
        lines = [header, f"  {'what':<22}{'bytes':>16}{'GiB':>8}  how"]
        lines += [f"  {what:<22}{size:>16,}{size / GIB:>8.2f}  {how}" for what, size, how in self.rows]
        total = self.total_bytes
        lines.append(f"  {'total':<22}{total:>16,}{total / GIB:>8.2f}  of {gpu_bytes / GIB:g} GiB per GPU")
        lines.append(f"  {ACTIVATIONS_NOTE}")
        return "\n".join(lines)


def shard_rows(dim0: int, world: int, rank: int) -> int:
    """Rows of a ``dim0``-row tensor on ``rank`` under FSDP2's ``Shard(0)`` (``torch.chunk``: ceil-sized chunks)."""
    chunk = math.ceil(dim0 / world)
    return max(0, min(chunk, dim0 - rank * chunk))


def local_numel(shapes: list[TensorShape], settings: PlanSettings, rank: int = 0, trainable_only: bool = False) -> int:
    """Elements of ``shapes`` held by ``rank``: all of them unsharded, its ``Shard(0)`` pieces under FSDP2."""
    chosen = [s for s in shapes if s.trainable or not trainable_only]
    if not settings.sharded:
        return sum(s.numel for s in chosen)
    return sum(shard_rows(s.dim0, settings.world, rank) * s.rest for s in chosen)


def memory_plan(
    shapes: list[TensorShape], settings: PlanSettings, engine: EngineShare | None = None, rank: int = 0
) -> MemoryPlan:
    """The per-rank memory of the policy (``shapes``), its training state, the reference and the engine.

    Args:
        shapes: Every parameter tensor of the policy (the PEFT wrapper's with LoRA; tied weights once).
        settings: World size, strategy, precision, reference.
        engine: The engine's share, or None when it takes nothing on the GPU.
        rank: The rank to plan for (0 holds the largest FSDP2 pieces).

    Returns:
        The lines of the plan.
    """
    size = settings.param_bytes
    where = f"/ {settings.world} ranks (FSDP2 Shard(0))" if settings.sharded else "replicated on every rank"
    params = local_numel(shapes, settings, rank)
    trainable = local_numel(shapes, settings, rank, trainable_only=True)
    total, trained = sum(s.numel for s in shapes), sum(s.numel for s in shapes if s.trainable)
    plan = MemoryPlan()
    plan.rows.append(("parameters", params * size, f"{total:,} x {size} B {where}"))
    what = "all" if trained == total else "LoRA adapters only"
    plan.rows.append(("gradients", trainable * size, f"{trained:,} trainable ({what}) x {size} B {where}"))
    plan.rows.append(("AdamW moments", 2 * trainable * size, f"exp_avg + exp_avg_sq, 2 x {size} B, no master copy"))
    if settings.ddp and not settings.sharded:
        plan.rows.append(("DDP gradient buckets", trainable * size, "the reducer's flat copy of the gradients"))
    if settings.reference:
        frozen = [TensorShape(s.dim0, s.rest, False) for s in shapes]
        sharded = settings.sharded and settings.shard_reference
        ref_settings = PlanSettings(settings.world, sharded, settings.ddp, size, True)
        how = f"/ {settings.world} ranks" if sharded else "a whole frozen copy on every rank"
        plan.rows.append(("reference (beta > 0)", local_numel(frozen, ref_settings, rank) * size, how))
    if engine is not None:
        plan.rows.append(("rollout engine", engine.budget_bytes, engine.note))
    return plan


def vllm_share(
    weight_numel: int,
    weight_bytes: int,
    gpu_bytes: int,
    gpu_memory_utilization: float,
    kv_cache_memory_bytes: int | None = None,
    tensor_parallel_size: int = 1,
) -> EngineShare:
    """A colocated vLLM engine's share: ``gpu_memory_utilization x GPU`` (weights inside), or its weights plus an
    explicit KV cache size."""
    weights = weight_numel * weight_bytes // max(1, tensor_parallel_size)
    if kv_cache_memory_bytes is not None:
        note = f"vLLM: weights {weights / GIB:.2f} GiB + kv_cache_memory_bytes {kv_cache_memory_bytes / GIB:.2f} GiB"
        return EngineShare(weights + int(kv_cache_memory_bytes), weights, note)
    budget = int(gpu_memory_utilization * gpu_bytes)
    note = f"vLLM gpu_memory_utilization {gpu_memory_utilization} x GPU (its weights {weights / GIB:.2f} GiB inside)"
    return EngineShare(budget, weights, note)


def fits(plan: MemoryPlan, gpu_bytes: int, engine: EngineShare | None = None) -> str | None:
    """Why the plan cannot run on a GPU of ``gpu_bytes`` (one sentence), or None when it fits."""
    if engine is not None and engine.weight_bytes > engine.budget_bytes:
        return (
            f"the vLLM engine's weights ({engine.weight_bytes / GIB:.2f} GiB) exceed its share of the GPU "
            f"({engine.budget_bytes / GIB:.2f} GiB); raise --rollout.engine_kwargs.gpu_memory_utilization"
        )
    if plan.total_bytes > gpu_bytes:
        return (
            f"the plan needs {plan.total_bytes / GIB:.2f} GiB per rank before activations, more than "
            f"--gpu_memory_gib {gpu_bytes / GIB:g}; shard (--trainer.strategy model_parallel), add ranks, "
            "use bf16-true or LoRA"
        )
    return None
