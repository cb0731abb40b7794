"""The one sharded strategy: FSDP2 through Lightning's ``ModelParallelStrategy``, registered as ``model_parallel``.

    lit-fgrpo fit --config configs/maze_tiny.yaml --config configs/maze/fsdp.yaml --trainer.devices 2

``strategy: model_parallel`` (or ``class_path: lit_fgrpo.distributed.strategy.FSDP2Strategy`` with ``init_args``)
selects :class:`FSDP2Strategy`: Lightning's ``ModelParallelStrategy`` with

* a device mesh spanning every rank in its ``data_parallel`` dimension (``num_nodes x devices`` by 1): the module
  shards over all ranks (:func:`lit_fgrpo.distributed.sharding.shard_policy` in ``FGRPOModule.configure_model``);
* single-file checkpoints by default (``save_distributed_checkpoint=False``): rank 0 writes the full weights and
  optimizer states through the run's checkpoint IO (atomic writes, checked resumes); resuming loads them into the
  shards. (``True`` writes a folder of per-rank shards instead, which ``--ckpt_path`` checks cannot read.)
* the :class:`~lit_fgrpo.distributed.sharding.ShardingSettings` the module reads (mixed precision, activation
  checkpointing, resharding, whether the reference is sharded).

Lightning's ``FSDPStrategy`` (FSDP1, ``strategy: fsdp``) is refused (:func:`check_strategy`): its flat parameters
are not what the weight push, the checkpoint and ``save_pretrained`` paths here handle, and it was never tested.
It also runs on CPU (gloo), which is how the tests prove it.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from typing_extensions import override

from lit_fgrpo.distributed.sharding import ShardingSettings
from lit_fgrpo.errors import ConfigError

STRATEGY_NAME = "model_parallel"
"""``--trainer.strategy`` value for :class:`FSDP2Strategy`."""

_FSDP1_NAMES = ("fsdp", "fsdp_cpu_offload")
_FSDP1_CLASSES = ("FSDPStrategy", "lightning.pytorch.strategies.FSDPStrategy")


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` sharding over all ranks, with the library's sharding settings.

    Args:
        sharding: How the module shards the policy and the reference.
        save_distributed_checkpoint: False (default): one checkpoint file written by rank 0; True: a folder of shards.
        **kwargs: Passed to ``ModelParallelStrategy`` (``process_group_backend``, ``timeout``, sizes).
    """

    def __init__(
        self, sharding: ShardingSettings | None = None, save_distributed_checkpoint: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)
        self.sharding = sharding or ShardingSettings()

    @override
    def setup_environment(self) -> None:
        # Lightning's default splits the mesh into nodes x devices; FSDP here shards over every rank at once.
        if self._data_parallel_size == "auto" and self._tensor_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
            self._tensor_parallel_size = 1
        super().setup_environment()

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        # torch's set_optimizer_state_dict builds the empty local AdamW states with a zero-lr step, but skips that
        # when any parameter holds a gradient; then no local state tensor exists and the load fails with
        # "Expected device to be set". Gradients are never part of a checkpoint: drop them first.
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        return super().load_checkpoint(checkpoint_path, weights_only=weights_only)


def sharding_settings(strategy: Any) -> ShardingSettings:
    """The sharding settings of a trainer's strategy (the defaults for a plain ``ModelParallelStrategy``)."""
    settings = getattr(strategy, "sharding", None)
    return settings if isinstance(settings, ShardingSettings) else ShardingSettings()


def check_strategy(strategy: Any) -> None:
    """Refuse FSDP1 (``strategy: fsdp``, ``FSDPStrategy``) in a config value or a strategy instance.

    Args:
        strategy: ``--trainer.strategy`` as parsed: a name, a ``{"class_path": ...}`` mapping, or a ``Strategy``.

    Raises:
        ConfigError: For FSDP1, naming the supported strategy.
    """
    if isinstance(strategy, dict) or hasattr(strategy, "class_path"):
        name = str(strategy.get("class_path", "") if isinstance(strategy, dict) else strategy.class_path)
    elif isinstance(strategy, str):
        name = strategy
    else:
        name = type(strategy).__name__
    if name in _FSDP1_NAMES or name in _FSDP1_CLASSES or name.endswith(".FSDPStrategy"):
        raise ConfigError(
            f"--trainer.strategy {name} (FSDP1) is not supported; use --trainer.strategy {STRATEGY_NAME} "
            "(FSDP2 through Lightning's ModelParallelStrategy, the tested sharded path)"
        )


def register() -> None:
    """Register ``model_parallel`` in Lightning's strategy registry (idempotent)."""
    if STRATEGY_NAME not in StrategyRegistry:
        StrategyRegistry.register(
            STRATEGY_NAME, FSDP2Strategy, description="FSDP2 over all ranks (lit_fgrpo.distributed.strategy)"
        )


register()


def shard_for_strategy(strategy: Any, mesh: Any, policy: Any, references: list[Any]) -> None:
    """What ``FGRPOModule.configure_model`` does per strategy: refuse FSDP1; under a device mesh (FSDP2), shard the
    policy and (unless ``shard_reference`` is off) the frozen reference in ``references`` the same way.

    Raises:
        ConfigError: For FSDP1, or a tensor-parallel mesh.
    """
    from lit_fgrpo.distributed.sharding import shard_policy

    check_strategy(strategy)
    if mesh is None:
        return
    settings = sharding_settings(strategy)
    shard_policy(policy, mesh, settings)
    if settings.shard_reference:
        frozen = ShardingSettings(settings.mixed_precision, False, settings.reshard_after_forward)
        for reference in references:
            shard_policy(reference, mesh, frozen)
