"""``tests/file_seconds.json``, the measured seconds per test file that order the suite (longest first)."""

import json
from pathlib import Path

from tests.conftest import FILE_SECONDS

ROOT = Path(__file__).resolve().parents[1]


def test_every_measured_file_exists_and_the_slowest_are_measured() -> None:
    seconds = json.loads(FILE_SECONDS.read_text())
    assert all((ROOT / path).is_file() for path in seconds), "regenerate it: scripts/test_durations.py"
    assert all(isinstance(s, float | int) and s >= 0 for s in seconds.values())
    # the vLLM server files are the ones whose place in the order matters (minutes each)
    assert {"tests/servers/test_faults.py", "tests/servers/test_engine.py"} <= set(seconds)
