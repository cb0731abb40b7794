"""The per-server half of a weight check: one server's log-probs of the probe rows, through both of its paths.

Teacher-forced rows (``prompt_logprobs`` of prompt + completion: the weights, ``lm_head`` included), the last token
replaced by its log-prob through the sampling path (a one-token request on prompt + completion minus its last token:
it reads the prefix cache, so a stale cache shows as well as stale weights). The engine compares them with the
trainer's (:func:`~lit_fgrpo.engines.sync_check.check_logprob_gap`) on every server after a push.
"""

from __future__ import annotations

import torch

from lit_fgrpo.servers import completions_api
from lit_fgrpo.servers.client import ServerClient

COMPLETIONS = "/v1/completions"


def server_logprobs(
    client: ServerClient, model: str, prompt_ids: list[list[int]], completion_ids: list[list[int]]
) -> list[torch.Tensor]:
    """Log-probs of each completion (one ``(len(completion),)`` tensor per row) on the server behind ``client``,
    requesting ``model`` (the served model or an adapter)."""
    out = []
    for prompt, completion in zip(prompt_ids, completion_ids):
        answer = client.post(
            COMPLETIONS, completions_api.score_body(model, prompt, completion), client.control_timeout_s
        )
        forced = completions_api.parse_scores(answer, len(prompt), completion)
        if completion:
            body = completions_api.cache_probe_body(model, prompt + completion[:-1], completion[-1])
            forced[-1] = completions_api.parse_cache_probe(
                client.post(COMPLETIONS, body, client.control_timeout_s), completion[-1]
            )
        out.append(torch.tensor(forced))  # (len(completion),)
    return out
