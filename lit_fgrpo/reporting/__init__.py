"""What a researcher opens after a run: figures (pure functions of numbers) and MLflow artifacts.

- :func:`pass_at_k_figure`: held-out pass@k against k (log x), before and after RL.
- :func:`focal_figure`: the per-group success-rate distribution and the focal weight over training.
- :func:`log_figure`, :func:`log_policy`, :func:`load_policy_from_run`: put them (and the policy) in the run.
"""

from lit_fgrpo.reporting.artifacts import POLICY_ARTIFACT_PATH, load_policy_from_run, log_figure, log_policy
from lit_fgrpo.reporting.focal_figure import focal_figure
from lit_fgrpo.reporting.pass_at_k_figure import pass_at_k_figure, pass_at_k_from_metrics

__all__ = [
    "POLICY_ARTIFACT_PATH",
    "focal_figure",
    "load_policy_from_run",
    "log_figure",
    "log_policy",
    "pass_at_k_figure",
    "pass_at_k_from_metrics",
]
