"""Offline stand-ins for the multi-turn tests: a tiny ChatML tokenizer, a tiny policy, and a scripted "model".

* :func:`chat_tokenizer`: a byte-level BPE (about 400 ids) trained here in milliseconds on arithmetic and tool-call
  text, with SmolLM2's ChatML template (without its default system prompt); ``<|im_end|>`` is EOS.
* :func:`tiny_policy`: a random 2-layer Llama over that vocabulary (``initializer_range`` 0.15, so that its samples
  vary), for a real ``generate`` loop.
* :class:`ScriptedModel`: a deterministic fake ``generate`` callable. It stands in for the engine, which the wiring
  step replaces it with: the reply of each row is ``script(prompt_text, turn)`` encoded (plus ``<|im_end|>``), the
  "log-probs" are a function of the row's seed and the token's place, and every call is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "What is 13 + 7? Reply with just the number.",
    "Wrong, try again. Wrong, try again.",
    "The answer is 20. I think it is 21.",
    '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
    '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 7}}</tool_call>',
    "error: unknown tool; bad arguments; malformed tool call",
    "user assistant tool system",
] * 4


@lru_cache(maxsize=1)
def chat_tokenizer() -> Any:
    """The tiny ChatML tokenizer (built once per test session)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )
    tokenizer.chat_template = CHATML
    return tokenizer


def prompt_ids(question: str) -> list[int]:
    """A one-question chat prompt with its generation prompt, as the data module tokenises it."""
    tokenizer = chat_tokenizer()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tiny_policy(seed: int = 0) -> Any:
    """A random 2-layer Llama over :func:`chat_tokenizer`'s vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(chat_tokenizer()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=0.15,
    )
    return LlamaForCausalLM(config).eval()


class ScriptedModel:
    """A deterministic stand-in for the engine's ``generate`` (the wiring step replaces it with the real engine).

    Args:
        script: ``(prompt_text, turn) -> reply text``; ``turn`` counts the assistant turns already in the row.
        ids: Optional ``(prompt_text, turn) -> token ids`` overriding the encoded reply (to return token sequences a
            decode/encode round trip would change).
    """

    def __init__(
        self,
        script: Callable[[str, int], str],
        ids: Callable[[str, int], list[int] | None] | None = None,
    ) -> None:
        self.script = script
        self.ids = ids
        self.calls: list[tuple[list[list[int]], list[int], list[int]]] = []

    def __call__(
        self, prompts: list[list[int]], caps: list[int], seeds: list[int]
    ) -> Sequence[tuple[list[int], list[float] | None, bool]]:
        tokenizer = chat_tokenizer()
        self.calls.append(([list(p) for p in prompts], list(caps), list(seeds)))
        rows = []
        for prompt, seed in zip(prompts, seeds):
            text = tokenizer.decode(prompt, skip_special_tokens=False)  # the fake's own reading, not the driver's
            first = text.find("<|im_start|>user")
            turn = text.count("<|im_start|>assistant\n") - 1
            question = text[first:]
            ids = self.ids(question, turn) if self.ids else None
            if ids is None:
                ids = list(tokenizer(self.script(question, turn), add_special_tokens=False)["input_ids"])
                ids.append(tokenizer.eos_token_id)
            logprobs = [-((seed % 97) + 1 + k) / 100 for k in range(len(ids))]
            rows.append((ids, logprobs, ids[-1] == tokenizer.eos_token_id))
        return rows


def templated_tokenizer(template: str, special_tokens: Sequence[str] = ()) -> Any:
    """A copy of :func:`chat_tokenizer` with another chat template and extra special tokens (a template's turn
    markers, so that each is one token as in the model's own tokenizer); ``<s>`` is its BOS (templates write it)."""
    import copy

    tokenizer = copy.deepcopy(chat_tokenizer())
    tokenizer.add_special_tokens({"additional_special_tokens": sorted({*special_tokens, "<s>"}), "bos_token": "<s>"})
    tokenizer.chat_template = template
    return tokenizer
