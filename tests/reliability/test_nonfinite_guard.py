"""Group 3: a NaN/inf loss or gradient skips the optimizer step; the weights stay equal to the last good ones."""

from __future__ import annotations

import math

import pytest
import torch

from lit_fgrpo.errors import ConfigError, NonFiniteError, UserError
from lit_fgrpo.training.update_handles import NonFiniteGuard, first_nonfinite


def train(
    poison: dict[int, str], max_skips: int = 3, steps: int = 6
) -> tuple[torch.nn.Module, list[dict[str, torch.Tensor]], NonFiniteGuard]:
    """SGD on a linear model; ``poison[step]`` injects a NaN gradient (``"grad"``) or an inf loss (``"loss"``)."""
    torch.manual_seed(0)
    second = torch.nn.Linear(2, 1)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), second)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = NonFiniteGuard(max_consecutive=max_skips)
    snapshots = []
    x = torch.randn(8, 3)
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()  # (,)
        if poison.get(step) == "loss":
            loss = loss * math.inf
        loss.backward()
        if poison.get(step) == "grad":
            assert second.weight.grad is not None
            second.weight.grad[0, 0] = math.nan
        if guard.check(step, loss.detach(), model.named_parameters()):
            optimizer.step()
        else:
            optimizer.zero_grad(set_to_none=True)
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
    return model, snapshots, guard


@pytest.mark.parametrize("kind", ["grad", "loss"])
def test_skipped_step_keeps_the_last_good_weights(kind: str) -> None:
    _, snapshots, guard = train({2: kind})
    for name, value in snapshots[2].items():
        assert torch.isfinite(value).all(), name
        assert torch.equal(value, snapshots[1][name]), name  # step 2 skipped: weights of step 1
    assert not torch.equal(snapshots[3]["0.weight"], snapshots[2]["0.weight"])  # training went on
    assert guard.num_skipped == 1 and guard.consecutive == 0


def test_consecutive_skips_stop_the_run_naming_step_and_quantity() -> None:
    with pytest.raises(NonFiniteError) as info:
        train({1: "grad", 2: "grad", 3: "grad"}, max_skips=3)
    assert str(info.value) == "step 3: grad of 1.weight is not finite for the 3th step in a row; stopping"
    assert isinstance(info.value, UserError)


def test_a_finite_step_resets_the_run() -> None:
    _, _, guard = train({0: "grad", 1: "loss", 3: "grad", 4: "grad"}, max_skips=3, steps=5)
    assert guard.num_skipped == 4 and guard.consecutive == 2


def test_first_nonfinite_names_loss_before_gradients() -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([0.0, math.inf])
    assert first_nonfinite(torch.tensor(math.nan), [("w", p)]) == "loss"
    assert first_nonfinite(torch.tensor(1.0), [("w", p)]) == "grad of w"
    assert first_nonfinite(1.0, [("w", torch.nn.Parameter(torch.zeros(1)))]) is None  # no grad: ignored


@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_bad_skip_limit_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match=r"--model.optimizer.max_nonfinite_skips must be an integer >= 1"):
        NonFiniteGuard(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None])
def test_first_nonfinite_agrees_with_a_per_entry_loop(bad: float | None) -> None:
    """The norm-first check against the definition (any entry non-finite), including finite gradients whose
    2-norm overflows float32 (3e38 squared): those are finite and must not be reported."""
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (5, 7, 3)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    params[1].grad[2] = 3e38  # finite; the norm of the gradients overflows to inf
    if bad is not None:
        params[2].grad[1] = bad
    named = [(f"p{i}", p) for i, p in enumerate(params)]
    loop = next((f"grad of {name}" for name, p in named for v in p.grad.tolist() if not math.isfinite(v)), None)
    assert first_nonfinite(1.0, named) == loop
    assert (loop is None) == (bad is None)
