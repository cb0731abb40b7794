"""Write ``tests/file_seconds.json`` (seconds per test file) from a pytest JUnit XML report.

``scripts/test.sh`` hands the test files to its pytest-xdist workers longest first (``tests/conftest.py`` orders the
collection by this file, ``--no-loadscope-reorder`` keeps that order): with 3 workers and files that take from a
second to five minutes, xdist's own order (most tests first) left the few-test, minutes-long server files for last,
and one worker ran alone for the final minutes. Regenerate after adding a slow test file:

    .venv/bin/python -m pytest -n 3 --dist loadfile --junitxml=/tmp/junit.xml -o junit_duration_report=total
    .venv/bin/python scripts/test_durations.py /tmp/junit.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "file_seconds.json"


def file_seconds(report: Path) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of its tests), longest first."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        seconds[path] += float(case.get("time", 0.0))
    return {path: round(s, 1) for path, s in seconds.most_common()}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python scripts/test_durations.py JUNIT_XML", file=sys.stderr)
        return 2
    OUT.write_text(json.dumps(file_seconds(Path(argv[0])), indent=0) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
