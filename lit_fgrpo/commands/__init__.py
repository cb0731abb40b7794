"""The commands' pieces below ``lit_fgrpo/cli.py`` (``lit-fgrpo``'s entry point): the LightningCLI of fit/validate/test
(``lightning_cli``), its one-line error reporting (``cli_errors``, ``cli_parse_errors``, ``config_checks``), ``plan``
(the memory plan before launch), ``simulate`` (the paper's categorical simulation) and ``import_gguf`` (a GGUF file to
a Hugging Face folder). Nothing of the library below imports them.
"""
