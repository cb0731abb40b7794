"""Theory: Lemma 3.1, the categorical simulation (paper §5) and the dNLL_rare diagnostic."""

from lit_fgrpo.theory.categorical_sweep import sweep_categorical
from lit_fgrpo.theory.dnll_rare import delta_nll_rare, sequence_nll
from lit_fgrpo.theory.simulation import SimulationResult, simulate_categorical
from lit_fgrpo.theory.tail_miss import tail_miss_probability

__all__ = [
    "SimulationResult",
    "delta_nll_rare",
    "sequence_nll",
    "simulate_categorical",
    "sweep_categorical",
    "tail_miss_probability",
]
