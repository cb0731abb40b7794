"""Training is deterministic on several threads: two runs of the same fit end with the same weights, bit for bit.

A user runs at torch's default thread count (2 on this CPU), not at the tests' pinned 1 (``tests/conftest.py``).
The fit is the one ``tests/reliability/kill_run.py`` resumes (tiny model, lr 1e-2, 12 RL steps): at lr 1e-2 Adam turns
a last-bit gradient difference into a visible weight difference, so this fit showed the shared-prompt backward's
thread-order sums (``lit_fgrpo/models/prompt_sharing.py``) in 3 runs of 3 before they were fixed.
"""

from __future__ import annotations

import torch

from lit_fgrpo.callbacks import WarmStartCallback
from tests.training.tiny_setup import maze_data, quiet_trainer, tiny_module, word_count_rollouts


def fit_weights(steps: int = 12) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    module = tiny_module(lr=1e-2, gamma=0.5)
    trainer = quiet_trainer(steps, [WarmStartCallback(steps=3, batch_size=8), word_count_rollouts()])
    trainer.fit(module, maze_data())
    return {name: p.detach().clone() for name, p in module.policy.state_dict().items()}


def test_two_fits_on_two_threads_end_with_the_same_weights() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        first, second = fit_weights(), fit_weights()
    finally:
        torch.set_num_threads(threads)
    moved = fit_weights(0)
    assert any(not torch.equal(moved[name], value) for name, value in first.items())  # the steps trained
    for name, value in first.items():
        assert torch.equal(second[name], value), name
