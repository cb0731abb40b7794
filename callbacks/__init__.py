"""Lightning callbacks of lit_fgrpo, installed as ``lit_fgrpo.callbacks`` (top-level ``callbacks/`` folder).

One job each: :class:`RolloutCallback` (engine, weight sync, rollouts attached to the batch),
:class:`PassAtKReport` (held-out pass@k before/after RL), :class:`SampleTable` (sample completions in MLflow),
:class:`RNGStateCallback` (RNG states in checkpoints), :class:`WarmStartCallback` (supervised warm start),
:class:`ConversationWarmStart` (supervised warm start on chat transcripts: tool use before RL),
:class:`FocalFigureCallback` (focal weight and success-rate figure), :class:`RLProgressBar` (steps of max_steps)
and :class:`GeneratedTokenBudget` (stop at a budget of generated tokens).
"""

from lit_fgrpo.callbacks.conversation_warm_start import ConversationWarmStart
from lit_fgrpo.callbacks.focal_figure import FocalFigureCallback
from lit_fgrpo.callbacks.pass_at_k_report import PassAtKReport
from lit_fgrpo.callbacks.progress_bar import RLProgressBar
from lit_fgrpo.callbacks.rng_state import RNGStateCallback
from lit_fgrpo.callbacks.rollout import RolloutCallback, RolloutConsumer
from lit_fgrpo.callbacks.sample_table import SampleTable
from lit_fgrpo.callbacks.token_budget import GeneratedTokenBudget
from lit_fgrpo.callbacks.warm_start import WarmStartCallback

__all__ = [
    "ConversationWarmStart",
    "FocalFigureCallback",
    "GeneratedTokenBudget",
    "PassAtKReport",
    "RLProgressBar",
    "RNGStateCallback",
    "RolloutCallback",
    "RolloutConsumer",
    "SampleTable",
    "WarmStartCallback",
]
