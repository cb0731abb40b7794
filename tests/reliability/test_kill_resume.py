"""A run SIGKILLed at three moments (twice during a checkpoint write) and resumed ends with the uninterrupted weights."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_fgrpo.servers.process import child_environment
from lit_fgrpo.training.checkpointing import load_checkpoint_checked

REPO = Path(__file__).resolve().parents[2]


def launch(folder: Path, kill: str, resume: bool) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "tests.reliability.kill_run", str(folder), "4", kill] + (
        ["--resume"] if resume else []
    )
    # One intra-op thread, as every in-process test has (conftest). With the default 2, CI once saw layer 1's k_proj
    # off by more than 1e-6: the shared-prompt pass's backward then added the rows of a prompt from 2 threads in a
    # varying order (fixed in lit_fgrpo/models/prompt_sharing.py, checked at 2 threads by tests/models/test_prompt_sharing.py),
    # and Adam at lr 1e-2 turns a last-bit difference into that. The pin keeps this test about resuming.
    env = child_environment({"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # five fresh interpreters with a tiny model: ~1-2 min on the 2-core CPU
def test_killed_three_times_and_resumed_matches_uninterrupted(tmp_path: Path) -> None:
    straight = launch(tmp_path / "straight", "none", resume=False)
    assert straight.returncode == 0, straight.stderr[-3000:]

    folder = tmp_path / "killed"
    # write:2 dies writing step 2's checkpoint (step 1's stays); step:2 dies before step 3; write:2 of the third
    # process dies writing step 4's checkpoint (it writes step 3's first). Each resume starts from the last good one.
    for kill, resume, saved_step in [("write:2", False, 1), ("step:2", True, 2), ("write:2", True, 3)]:
        done = launch(folder, kill, resume)
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
        assert not (folder / "final.pt").exists()
        last = load_checkpoint_checked(folder / "ckpt" / "last.ckpt")  # the resume point survived the kill
        assert last["global_step"] == saved_step
    assert any(p.name.startswith(".last.ckpt.tmp-") for p in (folder / "ckpt").iterdir())  # a write was cut short
    final = launch(folder, "none", resume=True)
    assert final.returncode == 0, final.stderr[-3000:]

    expected = torch.load(tmp_path / "straight" / "final.pt")
    resumed = torch.load(folder / "final.pt")
    assert expected.keys() == resumed.keys()
    for name, value in expected.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=1e-6, msg=name)
