"""pass_at_k against math.comb; PassAtK as a torchmetrics Metric (update/compute/merge/forward/log)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from lit_fgrpo.metrics import PassAtK, pass_at_k


def exact(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def test_matches_math_comb_exhaustively_small() -> None:
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                got = pass_at_k(n, c, k).item()
                assert got == pytest.approx(exact(n, c, k), abs=1e-12), (n, c, k)


def test_matches_math_comb_large_n() -> None:
    n = torch.full((50,), 1024)
    c = torch.randint(0, 1025, (50,))
    for k in (1, 2, 16, 256, 1024):
        want = torch.tensor([exact(1024, int(ci), k) for ci in c], dtype=torch.float64)
        torch.testing.assert_close(pass_at_k(n, c, k), want, rtol=1e-9, atol=1e-12)


def test_no_correct_sample_gives_exactly_zero() -> None:
    for n in (1, 7, 64, 1024):
        for k in sorted({1, min(2, n), n // 2 or 1, n}):
            assert pass_at_k(n, 0, k).item() == 0.0


def test_pass_at_1_is_the_success_rate_and_monotone_in_k() -> None:
    c = torch.arange(0, 65)
    torch.testing.assert_close(pass_at_k(64, c, 1), c.double() / 64)
    vals = torch.stack([pass_at_k(64, c, k) for k in (1, 2, 4, 8, 16, 32, 64)])
    assert (vals[1:] >= vals[:-1] - 1e-15).all()


@pytest.mark.parametrize(
    ("n", "c", "k", "match"), [(4, 1, 5, "num_samples"), (4, 1, 0, "k must"), (4, 5, 1, "num_correct")]
)
def test_bad_input(n: int, c: int, k: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_metric_single_and_multi_k() -> None:
    correct = torch.rand(37, 16) < 0.2
    m = PassAtK(4)
    m.update(correct[:20])
    m.update(correct[20:])
    want = pass_at_k(torch.full((37,), 16), correct.sum(1), 4).mean()
    torch.testing.assert_close(m.compute(), want)
    multi = PassAtK([1, 16])
    multi.update(correct)
    out = multi.compute()
    assert isinstance(out, dict) and set(out) == {"pass_at_1", "pass_at_16"}
    assert all("@" not in key for key in out)
    torch.testing.assert_close(out["pass_at_1"], correct.double().mean())


def test_merge_state_equals_one_metric() -> None:
    a_data, b_data = torch.rand(10, 8) < 0.3, torch.rand(6, 8) < 0.6
    a, b, both = PassAtK([1, 8]), PassAtK([1, 8]), PassAtK([1, 8])
    a.update(a_data)
    b.update(b_data)
    both.update(torch.cat([a_data, b_data]))
    a.merge_state(b)
    for key, value in both.compute().items():  # type: ignore[union-attr]
        torch.testing.assert_close(a.compute()[key], value)  # type: ignore[index]


def test_metric_rejects_too_few_samples_and_bad_k() -> None:
    with pytest.raises(ValueError, match="fewer than k=8"):
        PassAtK(8).update(torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=">= 1"):
        PassAtK([1, 0])
    with pytest.raises(ValueError, match=r"\(P, n\)"):
        PassAtK(1).update(torch.ones(4, dtype=torch.bool))


def test_metric_logs_from_a_lightning_module(tmp_path) -> None:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.pass_at = PassAtK([1, 4])

        def validation_step(self, batch, batch_idx):
            self.pass_at.update(batch[0])

        def on_validation_epoch_end(self) -> None:
            self.log_dict({f"val/{k}": v for k, v in self.pass_at.compute().items()})  # type: ignore[union-attr]
            self.pass_at.reset()

    data = torch.rand(8, 4) < 0.5
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=4)
    trainer = L.Trainer(default_root_dir=tmp_path, logger=False, enable_progress_bar=False, enable_model_summary=False)
    (metrics,) = trainer.validate(Module(), loader, verbose=False)
    assert metrics["val/pass_at_1"] == pytest.approx(data.float().mean().item(), abs=1e-6)


@pytest.mark.parametrize("shape", [(7, 8), (5, 1024), (3, 4096), (4, 13), (2, 2048 + 8)])
def test_count_true_per_row_matches_sum(shape: tuple[int, int]) -> None:
    from lit_fgrpo.metrics import count_true_per_row

    for density in (0.0, 0.3, 1.0):
        correct = torch.rand(*shape) < density
        assert torch.equal(count_true_per_row(correct), correct.sum(1))
    assert torch.equal(count_true_per_row(correct[:, ::2]), correct[:, ::2].sum(1))  # non-contiguous fallback


def test_half_width_against_the_sample_standard_deviation_over_problems() -> None:
    import statistics

    correct = torch.rand(41, 16) < 0.3
    per_problem = [exact(16, int(c), 4) for c in correct.sum(1)]
    want = 1.96 * statistics.stdev(per_problem) / math.sqrt(len(per_problem))
    metric = PassAtK([1, 4])
    metric.update(correct[:30])
    metric.update(correct[30:])  # the interval comes from summed states, as after a DDP reduction
    assert metric.half_width()["ci95_pass_at_4"] == pytest.approx(want, rel=1e-9)
    interval = PassAtK(4, statistic="ci95")
    interval.update(correct)
    assert float(interval.compute()) == pytest.approx(want, rel=1e-9)  # type: ignore[arg-type]
    # keys name the statistic, so that nothing reading pass_at_<k> takes an interval for a mean
    intervals = PassAtK([1, 4], statistic="ci95")
    intervals.update(correct)
    assert set(intervals.compute()) == {"ci95_pass_at_1", "ci95_pass_at_4"}  # type: ignore[arg-type]


def test_half_width_of_one_problem_is_nan_and_of_equal_problems_zero() -> None:
    one = PassAtK(1)
    one.update(torch.tensor([[True, False]]))
    assert math.isnan(one.half_width()["ci95_pass_at_1"])
    same = PassAtK(1)
    same.update(torch.tensor([[True, False]] * 7))
    assert same.half_width()["ci95_pass_at_1"] == 0.0
    with pytest.raises(ValueError, match="statistic"):
        PassAtK(1, statistic="sd")  # type: ignore[arg-type]
