"""The commands of ``lit-fgrpo``: the LightningCLI (``fit``, ``validate``, ``test``), its one-line error reporting,
``plan`` (the memory plan before launch), ``simulate`` (the paper's categorical simulation), ``import-gguf``
(a GGUF file to a Hugging Face folder) and ``compare`` (arms x seeds). Nothing below this package imports it.
"""
