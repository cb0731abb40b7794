"""Run ``../shared/tools/batch_walk.py`` with its leaf rule applied to today's paths.

The tool names its leaves and cross-cutting files by the paths they had when it was written
(``rollout/hf``, ``logprobs``, ``timing`` under ``lit_fgrpo/``, ...). The roles are unchanged by the layout of
``docs/architecture.md``; their files moved (engines to ``lit_fgrpo/engines/``, servers to
``lit_fgrpo/servers/``, the log-prob kernel to ``lit_fgrpo/models/``, timers and progress to
``lit_fgrpo/reporting/``). This runs the same tool, with the same rule, on both the old and the new paths:

    python scripts/batch_walk_roles.py [--tool PATH] --leaves -- fit --config configs/maze_tiny.yaml

Without this wrapper the tool still runs (``python ../shared/tools/batch_walk.py --leaves -- ...``), but then the
engine, log-prob and timer files at their new paths count as files of the batch.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_OLD = "lit_fgrpo/"  # the tool's prefixes are built from parts so that path rewrites of this repo leave them alone
SAME_ROLE = {
    _OLD + "rollout/hf": "lit_fgrpo/engines/hf",
    _OLD + "rollout/vllm": "lit_fgrpo/engines/vllm",
    _OLD + "rollout/servers/": "lit_fgrpo/servers/",
    _OLD + "rollout/decode": "lit_fgrpo/engines/decode",
    _OLD + "rollout/cpu_split": "lit_fgrpo/engines/cpu_split",
    _OLD + "rollout/row_sampling": "lit_fgrpo/engines/row_sampling",
    _OLD + "logprobs": "lit_fgrpo/models/logprobs",
    _OLD + "timing": "lit_fgrpo/reporting/timing",
    _OLD + "progress": "lit_fgrpo/reporting/progress",
    _OLD + "notices": "lit_fgrpo/reporting/notices",
}
"""The tool's path prefix -> the same role's path today (the tool's own prefixes are kept too)."""


def main() -> None:
    args = sys.argv[1:]
    tool = Path(__file__).resolve().parents[1].parent / "shared" / "tools" / "batch_walk.py"
    if args[:1] == ["--tool"]:
        tool, args = Path(args[1]), args[2:]
    if not tool.is_file():
        print(f"error: --tool: {tool} is not a file (the shared batch_walk.py)", file=sys.stderr)
        sys.exit(2)
    spec = importlib.util.spec_from_file_location("batch_walk", tool)
    assert spec is not None and spec.loader is not None
    walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walk)

    def widen(prefixes: tuple[str, ...]) -> tuple[str, ...]:
        return prefixes + tuple(SAME_ROLE[p] for p in prefixes if p in SAME_ROLE)

    walk.LEAVES, walk.CROSS_CUTTING = widen(walk.LEAVES), widen(walk.CROSS_CUTTING)
    sys.argv = [str(tool), *args]
    walk.main()


if __name__ == "__main__":
    main()
