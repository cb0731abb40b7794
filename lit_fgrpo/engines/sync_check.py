"""The weight-sync check's comparison and its one tolerance rule: after a push, the engine's log-probs of a few
completions must equal the trainer's.

Pure tensor code shared by every engine (``RolloutEngine.check_sync``, the server engine and its ranks); the check
itself, with the trainer's side of the comparison, is :func:`~lit_fgrpo.engines.trainer_logprobs.check_policy_sync`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

FLOAT32_SYNC_TOLERANCE = 1e-3
"""Engine and trainer in float32: different kernels agree to about 1e-5; a stale push differs by far more."""
HALF_SYNC_TOLERANCE = 0.25
"""Engine and trainer in bfloat16/float16: a bf16 vLLM engine on GPU differs from the trainer by up to about 0.2, a
bf16 HF copy on the CPU by about 0.01; weights that were not pushed (a random lm_head) still differ by whole nats."""


class WeightSyncError(RuntimeError):
    """The engine's log-probs disagree with the trainer's after a weight push (stale or partial weights)."""


def default_sync_tolerance(dtype: torch.dtype) -> float:
    """The sync check's tolerance for a policy whose parameters are ``dtype`` (``sync_tolerance: null``)."""
    return HALF_SYNC_TOLERANCE if dtype in (torch.bfloat16, torch.float16) else FLOAT32_SYNC_TOLERANCE


def check_logprob_gap(
    engine_logp: Sequence[Tensor], trainer_logp: Sequence[Tensor], tolerance: float, where: str
) -> float:
    """``max |logp_engine - logp_trainer|`` over all tokens; raises :class:`WeightSyncError` beyond ``tolerance``."""
    gap = 0.0
    for engine_row, trainer_row in zip(engine_logp, trainer_logp):
        if engine_row.numel():
            gap = max(gap, float((engine_row.float().cpu() - trainer_row.float().cpu()).abs().max()))
    if gap > tolerance:
        raise WeightSyncError(
            f"{where}: the engine's log-probs differ from the trainer's by {gap:.4g} > tolerance {tolerance:.4g}; "
            "the engine is generating with stale or partially loaded weights (e.g. a tied lm_head not pushed)"
        )
    return gap
