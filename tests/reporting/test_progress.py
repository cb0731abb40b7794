"""Status lines of the progress reporter: format against hand-written lines, cadence, modes."""

from __future__ import annotations

import io

import pytest

from lit_fgrpo.reporting.progress import ProgressReporter, format_duration, format_status, progress, resolve_mode


def test_format_status_reads_as_documented() -> None:
    line = format_status("warm start", 120, 600, 41.0, {"loss": 1.234})
    assert line == "warm start: step 120/600 (20%), loss 1.23, 00:41 elapsed, ~02:44 left"
    assert format_status("RL", 5, None, 3725.0, {}) == "RL: step 5, 1:02:05 elapsed"
    assert format_duration(59.6) == "01:00"


def test_lines_every_tenth_and_at_the_end() -> None:
    stream = io.StringIO()
    with progress("warm start", total=20, mode="lines", stream=stream, every_s=1e9, enabled=True) as bar:
        for _ in range(20):
            bar.update(1, loss=0.5)
    lines = stream.getvalue().splitlines()
    # a reference loop: one line each time another 10 % (2 steps) is done
    assert [line.split(",")[0] for line in lines] == [f"warm start: step {s}/20 ({5 * s}%)" for s in range(2, 21, 2)]


def test_interrupted_run_prints_where_it_stopped() -> None:
    stream = io.StringIO()
    with pytest.raises(RuntimeError), progress("eval", total=100, unit="batch", mode="lines", stream=stream,
                                                every_s=1e9, enabled=True) as bar:  # fmt: skip
        bar.update(3)
        raise RuntimeError("stop")
    assert stream.getvalue().splitlines()[-1].startswith("eval: batch 3/100 (3%)")


def test_modes_and_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert resolve_mode("auto", io.StringIO()) == "lines"
    assert resolve_mode("auto", Tty()) == "bar"
    monkeypatch.setenv("LIT_FGRPO_PROGRESS", "off")
    assert resolve_mode("auto", Tty()) == "off"
    monkeypatch.setenv("LIT_FGRPO_PROGRESS", "loud")
    with pytest.raises(ValueError, match="LIT_FGRPO_PROGRESS"):
        resolve_mode("auto", Tty())
    stream = io.StringIO()
    ProgressReporter("x", 2, mode="lines", stream=stream, enabled=False).update(2)  # not rank 0
    assert stream.getvalue() == ""


def test_bar_mode_draws_a_tqdm_bar() -> None:
    stream = io.StringIO()
    with progress("warm start", total=4, mode="bar", stream=stream, enabled=True) as bar:
        for _ in range(4):
            bar.update(1, loss=0.25)
    assert "warm start" in stream.getvalue() and "4/4" in stream.getvalue()


def test_cli_installs_the_rl_bar_unless_told_otherwise() -> None:
    from jsonargparse import Namespace

    from lit_fgrpo.callbacks.progress_bar import RLProgressBar, default_progress_bar

    (bar,) = default_progress_bar(Namespace(enable_progress_bar=True, callbacks=None))
    assert isinstance(bar, RLProgressBar)
    assert default_progress_bar(Namespace(enable_progress_bar=False, callbacks=None)) == []
    own = Namespace(class_path="lightning.pytorch.callbacks.RichProgressBar")
    assert default_progress_bar(Namespace(enable_progress_bar=True, callbacks=[own])) == []
