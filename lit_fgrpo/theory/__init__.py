"""Theory: Lemma 3.1, the categorical simulation (paper §5) and the dNLL_rare diagnostic."""

from lit_fgrpo.theory.tail_miss import tail_miss_probability

__all__ = ["tail_miss_probability"]

try:  # written in parallel; exported once present
    from lit_fgrpo.theory.simulation import SimulationResult, simulate_categorical, sweep_categorical

    __all__ += ["SimulationResult", "simulate_categorical", "sweep_categorical"]
except ImportError:  # pragma: no cover
    pass
try:
    from lit_fgrpo.theory.dnll_rare import delta_nll_rare, sequence_nll

    __all__ += ["delta_nll_rare", "sequence_nll"]
except ImportError:  # pragma: no cover
    pass
