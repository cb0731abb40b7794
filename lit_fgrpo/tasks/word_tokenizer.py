"""Word-level tokenizer for symbolic tasks: one whitespace-separated word = one fixed id.

Built offline with the ``tokenizers`` library (``WordLevel`` model, ``WhitespaceSplit`` pre-tokenizer) and wrapped
in ``PreTrainedTokenizerFast``. Nothing is added on encode (no automatic ``<bos>``), and decode joins the words
with single spaces, so ``decode(encode(text)) == text`` for normalised text.

Reloading: ``AutoTokenizer.from_pretrained`` keeps ``tokenizer.json`` as written when the folder has no
``config.json`` or a Llama-type one. With a Qwen2 ``config.json`` next to it, transformers 5 builds a
``Qwen2Tokenizer`` and replaces the pre-tokenizer, which breaks words such as ``GRID_START``; save the tokenizer
in its own folder then, or use ``arch="llama"`` for the policy (see ``tiny_policy``).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS: dict[str, str] = {
    "pad_token": "<pad>",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "unk_token": "<unk>",
}
"""Roles of the special words; each must be in the vocabulary."""


def build_word_tokenizer(vocab: list[str]) -> PreTrainedTokenizerFast:
    """Build a word-level tokenizer whose ids are the positions in ``vocab``.

    Args:
        vocab: Distinct words without whitespace, including ``<pad> <bos> <eos> <unk>``.

    Returns:
        A fast tokenizer with pad/bos/eos/unk set, right padding and no chat template.

    Raises:
        ValueError: If the words are not distinct, contain whitespace, start with ``##`` (the decoder's
            continuation mark), or lack a special word.
    """
    if len(set(vocab)) != len(vocab):
        raise ValueError("vocabulary words must be distinct")
    if any(not word or word.startswith("##") or any(ch.isspace() for ch in word) for word in vocab):
        raise ValueError("vocabulary words must be non-empty, contain no whitespace and not start with '##'")
    missing = [tok for tok in SPECIAL_TOKENS.values() if tok not in vocab]
    if missing:
        raise ValueError(f"vocabulary lacks special words {missing}")

    core = Tokenizer(WordLevel(vocab={word: i for i, word in enumerate(vocab)}, unk_token=SPECIAL_TOKENS["unk_token"]))
    core.pre_tokenizer = WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    core.add_special_tokens(list(SPECIAL_TOKENS.values()))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        **SPECIAL_TOKENS,
    )
    tokenizer.chat_template = None
    return tokenizer
