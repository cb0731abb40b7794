"""What the rollout callbacks may use from a LightningModule: the :class:`RolloutConsumer` protocol.

The callbacks read nothing else from the module (no ``isinstance`` on a concrete class), so a user's own
LightningModule gets the same behaviour as :class:`~lit_fgrpo.training.module.FGRPOModule` by providing these members.
:func:`missing_members` checks a module against a protocol without touching its properties: ``policy`` is built
lazily in ``configure_model``, and reading it in ``setup`` would build it too early.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import nn

from lit_fgrpo.objectives.group_weights import GroupWeight
from lit_fgrpo.reporting.timing import PhaseTimer


@runtime_checkable
class PolicyHolder(Protocol):
    """A module with a causal LM and its tokenizer (what the warm start needs)."""

    @property
    def policy(self) -> nn.Module:
        """The causal LM the engine samples from and receives weights from."""
        ...

    @property
    def tokenizer(self) -> Any:
        """Decodes completions for the reward functions; gives pad and EOS ids."""
        ...


@runtime_checkable
class RolloutConsumer(PolicyHolder, Protocol):
    """Everything :class:`~lit_fgrpo.callbacks.RolloutCallback` (and the figures) read from the module.

    The module's ``training_step(batch)`` then reads ``batch.rollout`` of a
    :class:`~lit_fgrpo.rollout.batch.PromptBatch` (return ``as_prompt_batch(batch)`` from its
    ``on_after_batch_transfer``). Metrics are logged through the module's own ``log_dict``.
    """

    @property
    def temperature(self) -> float:
        """The temperature the module divides its training logits by (compared with the sampling temperature)."""
        ...

    @property
    def pass_at_k_ks(self) -> list[int]:
        """The k of the pass@k the module logs (validation needs at least max(k) samples per prompt)."""
        ...

    @property
    def group_weight(self) -> GroupWeight:
        """The per-group weight the advantages are multiplied by (dynamic sampling keeps groups it weights)."""
        ...

    @property
    def importance_correction(self) -> str:
        """ "none", "token" or "sequence": asynchronous rollouts need one that is not "none"."""
        ...

    @property
    def timer(self) -> PhaseTimer:
        """The step timer: the callback times generate, reward, sync and wait into it; the module logs it."""
        ...


def missing_members(module: Any, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``module`` lacks. A member its class defines (a property) is not read;
    only the others are looked up on the instance (attributes, submodules)."""
    names = [n for n in dir(protocol) if not n.startswith("_") and n not in dir(Protocol)]
    return [n for n in sorted(names) if not (hasattr(type(module), n) or hasattr(module, n))]


def check_consumer(module: Any, protocol: type, who: str) -> None:
    """Refuse, in one line, a module that lacks members of ``protocol`` (named, with the protocol to implement)."""
    missing = missing_members(module, protocol)
    if missing:
        raise TypeError(
            f"{who} needs a module with {', '.join(missing)} (lit_fgrpo.callbacks.{protocol.__name__}); "
            f"{type(module).__name__} has not"
        )


__all__ = ["PolicyHolder", "RolloutConsumer", "check_consumer", "missing_members"]
