"""The JSON of vLLM's ``/v1/completions`` for our three uses, as pure functions: sample, score, probe the cache.

Prompts go in as token ids and ``return_token_ids`` brings token ids back, so no text is tokenized on either side.
Log-probs are vLLM's ``processed_logprobs`` (the launched servers set ``--logprobs-mode processed_logprobs``):
``log_softmax(z / T)`` of the sampled token, the trainer's definition.
"""

from __future__ import annotations

from typing import Any

from lit_fgrpo.engines.base import SamplingConfig

Json = dict[str, Any]


def sample_body(model: str, prompt: list[int], sampling: SamplingConfig, stop_ids: list[int], seed: int | None) -> Json:
    """One prompt's request: ``n`` completions with its own seed (vLLM gives child ``j`` the seed ``seed + j``,
    exactly what the colocated engine's ``SamplingParams(n, seed)`` does)."""
    body: Json = {
        "model": model,
        "prompt": list(prompt),
        "n": sampling.n,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
        "stop_token_ids": list(stop_ids),
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    if sampling.top_k > 0:
        body["top_k"] = sampling.top_k
    if seed is not None:
        body["seed"] = int(seed)
    return body


def parse_samples(response: Json, n: int) -> list[tuple[list[int], list[float], bool]]:
    """(token ids, sampling log-probs, finished by a stop token) of each of the ``n`` choices, in index order.

    Raises:
        ValueError: the response does not hold ``n`` choices with token ids and log-probs.
    """
    choices = sorted(response.get("choices") or [], key=lambda c: int(c["index"]))
    if len(choices) != n:
        raise ValueError(f"expected {n} choices, got {len(choices)}")
    out = []
    for choice in choices:
        ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if ids is None or logprobs is None or len(ids) != len(logprobs):
            raise ValueError("a choice lacks token_ids or log-probs (is the server a vLLM with return_token_ids?)")
        out.append(([int(t) for t in ids], [float(x) for x in logprobs], choice.get("finish_reason") == "stop"))
    return out


def score_body(model: str, prompt: list[int], completion: list[int]) -> Json:
    """Teacher-forced log-probs of ``completion`` after ``prompt`` (``prompt_logprobs``, temperature 1).

    vLLM computes prompt log-probs without reading its prefix cache, so this checks the weights, not the cache
    (:func:`cache_probe_body` checks that).
    """
    return {
        "model": model,
        "prompt": list(prompt) + list(completion),
        "max_tokens": 1,
        "temperature": 1.0,
        "prompt_logprobs": 0,
        "return_token_ids": True,
    }


def parse_scores(response: Json, prompt_len: int, completion: list[int]) -> list[float]:
    """The log-prob of each completion token from a :func:`score_body` response."""
    entries = response["choices"][0]["prompt_logprobs"]
    out = []
    for t, token in enumerate(completion):
        entry = entries[prompt_len + t] or {}
        if str(token) not in entry:
            raise ValueError(f"no prompt log-prob for token {token} at position {prompt_len + t}")
        out.append(float(entry[str(token)]["logprob"]))
    return out


def cache_probe_body(model: str, prefix: list[int], token: int) -> Json:
    """The log-prob of ``token`` after ``prefix`` through the sampling path, which reuses cached prefix blocks.

    A stale prefix cache after a push shows here and not in :func:`score_body`.
    """
    return {
        "model": model,
        "prompt": list(prefix),
        "max_tokens": 1,
        "temperature": 1.0,
        "logprobs": 0,
        "logprob_token_ids": [int(token)],
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }


def parse_cache_probe(response: Json, token: int) -> float:
    """The log-prob of ``token`` from a :func:`cache_probe_body` response."""
    top = response["choices"][0]["logprobs"]["top_logprobs"][0]
    key = f"token_id:{int(token)}"
    if key not in top:
        raise ValueError(f"no log-prob for token {token} in the cache probe's answer")
    return float(top[key])
