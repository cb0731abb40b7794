"""Measure how far the golden run's weights move (a) across CPU kernels and (b) when the behaviour is broken.

The golden test (``tests/training/test_golden.py``) keeps a recorded fixture; its tolerance must sit between the
drift that other kernels cause (no bug) and the change a real regression causes. This script measures both, each
case in its own interpreter (``ATEN_CPU_CAPABILITY`` is read once at import):

    .venv/bin/python scripts/golden_drift.py            # all cases, a table
    .venv/bin/python scripts/golden_drift.py --case sign  # one case, its JSON line

Cases: ``native`` (this CPU's kernels), ``default`` / ``avx2`` (torch's and MKL's other kernels), and the broken
behaviours ``sign`` (advantages negated), ``skip`` (one RL step fewer), ``seed`` (another sampling seed),
``gamma0`` (focal weight off: gamma 0 instead of 0.5), ``dr_grpo`` (another token aggregation), ``warm149`` (one
warm-start step fewer).
For each: the largest |W - W_fixture| after the warm start and after RL, the gradients' relative L2 error (the
worst RL optimizer step) and the RL update's relative L2 error (see ``distance_to_fixture``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = {
    "native": {},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
BROKEN = ("sign", "skip", "seed", "gamma0", "dr_grpo", "warm149")


def run_case(case: str) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)  # as in the test suite (tests/conftest.py)
    from tests.training import test_golden as golden

    kwargs: dict = {}
    if case == "sign":
        import lit_fgrpo.training.module as module

        original = module.group_advantages
        module.group_advantages = lambda *a, **k: -original(*a, **k)  # type: ignore[assignment]
    elif case == "skip":
        kwargs["steps"] = golden.STEPS - 1
    elif case == "seed":
        kwargs["rollout_seed"] = 1
    elif case == "gamma0":
        kwargs["gamma"] = 0.0
    elif case == "dr_grpo":
        kwargs["loss_type"] = "dr_grpo"
    elif case == "warm149":
        kwargs["warm_steps"] = golden.WARM_STEPS - 1
    return golden.distance_to_fixture(golden.run_maze_tiny(**kwargs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=[*KERNELS, *BROKEN])
    args = parser.parse_args()
    if args.case:
        print(json.dumps({"case": args.case, **run_case(args.case)}))
        return
    print(
        f"{'case':10s} {'warm max |dW|':>14s} {'final max |dW|':>15s} {'grad L2 error':>14s} {'update L2 error':>16s}"
    )
    for case in [*KERNELS, *BROKEN]:
        env = os.environ | KERNELS.get(case, {})
        out = subprocess.run(
            [sys.executable, __file__, "--case", case], env=env, capture_output=True, text=True, check=True
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{case:10s} {row['warm_abs']:14.2e} {row['final_abs']:15.2e} {row['grad_rel']:14.2e} {row['update_l2']:16.2e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
