"""Per-token log-probs (and entropies) of completions under a causal LM, in chunks through the output layer.

For each completion token y_t the log-prob is ``z[y_t] / tau - logsumexp(z / tau)`` with ``z = W h_t (+ b)``.
The fast path runs the decoder once to get the hidden states h, then for each chunk of ``chunk_tokens``
positions: ``lm_head`` -> logits chunk -> gather + logsumexp (+ entropy when asked). Full-vocabulary float32
logits exist for one chunk at a time, never for the whole batch: at Qwen2.5's V = 151,936, B * T = 8 x 512
positions would be 2.5 GB of float32 logits, while a chunk of 256 positions is 156 MB. Under autograd each chunk
is checkpointed (only its hidden states are kept; the logits are recomputed chunk by chunk in backward).

The fast path needs the decoder and ``lm_head`` separately, which HF causal LMs expose generically
(``base_model`` / ``get_output_embeddings``), and a forward that is exactly ``lm_head(decoder(x))``; families
that rescale or cap logits (Gemma 2 soft-capping, Cohere / Granite logit scales) and anything that is not an
HF model take the plain path: the model's own forward on ``chunk_rows`` rows at a time.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from lit_fgrpo.models.prompt_sharing import shared_prompt_hidden

# Families whose ``XForCausalLM.forward`` is ``lm_head(decoder(...).last_hidden_state)`` with nothing in between.
CHUNKABLE_MODEL_TYPES = frozenset(
    {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mistral", "mixtral", "phi3", "gemma", "olmo", "olmo2"}
)
# Config fields that, when set, mean the forward rescales or caps the logits after ``lm_head``.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
# Float32 logits per chunk when ``chunk_tokens`` is not given: 2 ** 26 floats = 256 MiB.
_AUTO_CHUNK_ELEMENTS = 1 << 26
# Under autograd, logits of at most 2 ** 24 floats (64 MiB) for a whole row chunk are kept, not recomputed: up to 341
# positions at SmolLM2's V = 49,152 (an RL step of 16 short replies), 110 at Qwen2.5's V = 151,936.
_KEEP_LOGITS_ELEMENTS = 1 << 24


@dataclass
class TokenLogprobs:
    """Log-probs (and optionally entropies) of completion tokens."""

    logp: Tensor
    """(B, T) log pi(y_t | x, y_<t) at the sampling temperature."""
    entropy: Tensor | None = None
    """(B, T) entropy of the next-token distribution, detached; None when not requested."""


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    forward = getattr(model, "forward", None)
    try:
        return forward is not None and "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic wrappers
        return False


def logprobs_from_logits(logits: Tensor, token_ids: Tensor, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """``log_softmax(logits)[token_ids]`` per position in float32, and the entropy (detached) when asked.

    One logsumexp serves both: ``logp = z[y] - logZ`` and ``H = logZ - sum_v softmax(z)_v z_v``.

    Args:
        logits: (..., V) logits (any float dtype).
        token_ids: (...) token ids to pick.
        with_entropy: also return the (...) entropy, computed without grad.

    Returns:
        (...) float32 log-probs, and (...) entropies or None.
    """
    logits = logits.float()
    # gather before logsumexp: in backward the two (..., V) gradients then meet in an order that adds them in place
    # (the other order kept one more (..., V) buffer at the peak: +220 MiB at V = 151,936 and 441-position chunks)
    picked = torch.gather(logits, dim=-1, index=token_ids.unsqueeze(-1)).squeeze(-1)  # (...)
    logz = torch.logsumexp(logits, dim=-1)  # (...)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = logz - (torch.exp(logits - logz.unsqueeze(-1)) * logits).sum(-1)  # (...)
    return picked - logz, entropy


def split_output_layer(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """``(decoder, lm_head)`` of an HF causal LM (PEFT-wrapped or not), or None when the split is not known safe.

    ``decoder(input_ids=..., attention_mask=..., position_ids=...)`` returns ``last_hidden_state`` (after the final
    norm) and ``lm_head(h)`` the logits; LoRA layers (PEFT) stay inside both, so adapters and
    ``disable_adapter()`` apply as in the model's own forward. Tied embeddings need nothing special: ``lm_head``
    is the module that holds the tied weight.
    """
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        # FSDP2 gathers the root's weights (embeddings, lm_head) in the root's forward hooks: the split path would
        # call the decoder and the head around them, so a sharded policy takes the plain path (issue 24)
        return None
    wrapper: Any = model
    base: Any = wrapper.get_base_model() if hasattr(wrapper, "get_base_model") else wrapper  # PEFT -> HF model
    config = getattr(base, "config", None)
    if config is None or getattr(config, "model_type", None) not in CHUNKABLE_MODEL_TYPES:
        return None
    if any(getattr(config, name, None) not in (None, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    get_head = getattr(base, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    decoder = getattr(base, "base_model", None)
    if not isinstance(head, nn.Module) or not isinstance(decoder, nn.Module) or decoder is base:
        return None
    return decoder, head


def _vocab_size(head: nn.Module) -> int:
    """Rows of the output layer's weight (the vocabulary); 2**17 when it has none to read (a conservative guess)."""
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, Tensor) else 1 << 17


def _chunk_stats(
    head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float, entropy: list[Tensor] | None
) -> Tensor:
    """Log-probs of ``targets`` for one chunk of hidden states; appends the chunk's entropy when asked.

    Args:
        head: the output layer.
        hidden: (n, H) hidden states.
        targets: (n,) token ids.
        temperature: logits are divided by it.
        entropy: a list to append the (n,) detached entropy to; None (as on checkpoint recompute) skips it.

    Returns:
        (n,) float32 log-probs.
    """
    logits = head(hidden)  # (n, V)
    if temperature != 1.0:
        logits = logits / temperature
    logp, ent = logprobs_from_logits(logits, targets, with_entropy=entropy is not None)  # (n,)
    if entropy is not None and ent is not None:
        entropy.append(ent)
    return logp


def _chunked_head(
    head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float, chunk_tokens: int, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """(n, H) hidden, (n,) targets -> (n,) log-probs and (n,) entropies, ``chunk_tokens`` positions at a time."""
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    vocab = _vocab_size(head)
    # Below _KEEP_LOGITS_ELEMENTS autograd keeps the logits: recomputing them in backward is one more output-layer
    # forward, which costs more time than the memory is worth (at V = 1,000 and 4,096 positions, 12 % of forward +
    # backward; on SmolLM2 with LoRA and 182 reply positions, about 9 %, with 16 MiB as the limit then).
    keep = hidden.shape[0] * vocab <= _KEEP_LOGITS_ELEMENTS
    for h, y in zip(hidden.split(chunk_tokens), targets.split(chunk_tokens)):
        if not grad or keep:
            logps.append(_chunk_stats(head, h, y, temperature, entropies if with_entropy else None))
            continue
        # Keep only h for backward; the (n, V) logits are recomputed there, one chunk at a time. The entropy is
        # collected on the first call only (the recompute passes None), so backward does not pay for it twice.
        sink: list[list[Tensor] | None] = [entropies if with_entropy else None]

        def run(h_: Tensor, y_: Tensor, sink: list[list[Tensor] | None] = sink) -> Tensor:
            out = _chunk_stats(head, h_, y_, temperature, sink[0])
            sink[0] = None
            return out

        # The head draws no random numbers: no RNG save/restore, which would also rewrite the global generator under
        # a rollout thread sampling concurrently (asynchronous rollouts with the HF-copy engine).
        logps.append(checkpoint(run, h, y, use_reentrant=False, preserve_rng_state=False))  # type: ignore[arg-type]
    logp = torch.cat(logps) if logps else hidden.new_zeros(0, dtype=torch.float32)
    ent = (torch.cat(entropies) if entropies else torch.zeros_like(logp)) if with_entropy else None
    return logp, ent


def completion_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_length: int,
    temperature: float = 1.0,
    chunk_rows: int = 64,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    chunked: bool | None = None,
    share_prompts: bool = True,
) -> TokenLogprobs:
    """Log-probs of the last ``completion_length`` tokens of each row.

    Args:
        model: a Hugging Face causal LM, PEFT-wrapped or not (or anything returning ``.logits`` of shape (b, L, V)).
        input_ids: (B, L) prompt (left-padded) followed by the completion (right-padded), L = Tp + T.
        attention_mask: (B, L) 1 on real tokens.
        completion_length: T, the number of trailing positions that are completion tokens.
        temperature: logits are divided by it, as at sampling time.
        chunk_rows: rows per decoder forward; bounds the activations (and, on the plain path, the logits).
        with_entropy: also return the per-token entropy (detached). Costs one exp over the logits: ask for it
            only on the pass that logs it.
        chunk_tokens: positions per output-layer chunk on the fast path; None = as many as keep one chunk's
            float32 logits at 256 MiB (``2**26 // V``).
        chunked: force the fast path (True; raises when the model cannot be split), the plain path (False), or
            choose (None: fast path for known HF families, see :func:`split_output_layer`).
        share_prompts: on the fast path, run the decoder over each distinct prompt of a row chunk once and the
            completions over its cached keys and values (:func:`shared_prompt_hidden`); False runs every row whole.

    Returns:
        :class:`TokenLogprobs` with (B, T) float32 tensors, 0 at the completion's padding positions
        (``attention_mask`` 0): on the fast path neither the decoder (mostly) nor the output layer runs there.
    """
    T = completion_length
    split = split_output_layer(model) if chunked is not False else None
    if chunked and split is None:
        raise ValueError(
            f"completion_logprobs(chunked=True): cannot split {type(model).__name__} into decoder and lm_head"
        )
    # Position ids from the attention mask, so that left padding does not shift RoPE positions.
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, L)
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    for start in range(0, input_ids.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        targets = input_ids[rows, -T:]  # (b, T)
        if split is not None:
            decoder, head = split
            b = targets.shape[0]
            real = attention_mask[rows, -T:].reshape(-1).nonzero().squeeze(1)  # (N,) flat row * T + t, row-major
            hidden = (
                shared_prompt_hidden(decoder, input_ids[rows], attention_mask[rows], position_ids[rows], T)
                if share_prompts
                else None
            )  # (N, H)
            if hidden is None:
                whole = decoder(
                    input_ids=input_ids[rows],
                    attention_mask=attention_mask[rows],
                    position_ids=position_ids[rows],
                    use_cache=False,
                ).last_hidden_state[:, -(T + 1) : -1, :]  # (b, T, H): position t predicts token t + 1
                hidden = whole.reshape(b * T, whole.shape[-1]).index_select(0, real)  # (N, H)
            n = chunk_tokens or max(1, _AUTO_CHUNK_ELEMENTS // _vocab_size(head))
            logp, ent = _chunked_head(
                head, hidden, targets.reshape(b * T).index_select(0, real), temperature, n, with_entropy
            )  # (N,)
            # padding positions get 0: no output-layer work is spent on them
            logps.append(logp.new_zeros(b * T).index_copy(0, real, logp).view(b, T))
            if ent is not None:
                entropies.append(ent.new_zeros(b * T).index_copy(0, real, ent).view(b, T))
            continue
        kwargs = {"logits_to_keep": T + 1} if _accepts_logits_to_keep(model) else {}
        out = model(
            input_ids=input_ids[rows], attention_mask=attention_mask[rows], position_ids=position_ids[rows], **kwargs
        )
        logits = out.logits[:, -(T + 1) : -1, :]  # (b, T, V): position t predicts token t + 1
        if temperature != 1.0:
            logits = logits / temperature
        logp, ent = logprobs_from_logits(logits, targets, with_entropy)  # (b, T)
        real = attention_mask[rows, -T:].to(logp.dtype)  # (b, T)
        logps.append(logp * real)
        if ent is not None:
            entropies.append(ent * real)
    return TokenLogprobs(torch.cat(logps), torch.cat(entropies) if with_entropy else None)


@contextmanager
def module_mode(model: nn.Module, training: bool) -> Iterator[None]:
    """Put ``model`` in train (``training=True``) or eval mode and restore its previous flag afterwards.

    The policy trains in train mode (gradient checkpointing and dropout apply only there) and samples, scores
    and computes its frozen old/reference log-probs in eval mode.
    """
    was_training = model.training
    model.train(training)
    try:
        yield
    finally:
        model.train(was_training)


def eval_mode(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Put ``model`` in eval mode and restore its previous training flag afterwards."""
    return module_mode(model, False)


def train_mode(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Put ``model`` in train mode and restore its previous training flag afterwards."""
    return module_mode(model, True)
