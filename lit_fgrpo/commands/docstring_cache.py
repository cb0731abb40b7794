"""Parse each class's attribute docstrings once per process, not once per subcommand parser.

The CLI documents every setting by its attribute docstring (``docstring_parse_attribute_docstrings=True``), and
LightningCLI builds one parser per subcommand (fit, validate, test, predict): jsonargparse asks
``docstring_parser.parse_from_object`` for the same classes (the trainer, the module, the data module, their
settings groups and callbacks) four times, and each call reads and tokenizes the class's source. That was about
3 s of the 4 s a ``lit-fgrpo fit`` spent building its parser on the 2-core CPU (measured with cProfile), paid again
by every in-process CLI call in the tests. The parse depends only on the object's source, which does not change
while the process runs, and jsonargparse only reads the result, so one cached parse per (object, style) is the
same answer.
"""

from __future__ import annotations

import functools
from typing import Any

import docstring_parser

_CACHED_MARK = "_lit_fgrpo_cached"


def cache_attribute_docstrings() -> None:
    """Wrap ``docstring_parser.parse_from_object`` with a per-process cache (idempotent).

    Objects that cannot be dictionary keys are parsed every time, as before.
    """
    original = docstring_parser.parse_from_object
    if getattr(original, _CACHED_MARK, False):
        return
    cache: dict[tuple[Any, Any], Any] = {}

    @functools.wraps(original)
    def parse_from_object(obj: Any, style: Any = docstring_parser.DocstringStyle.AUTO) -> Any:
        try:
            return cache[(obj, style)]
        except TypeError:  # unhashable: no cache
            return original(obj, style)
        except KeyError:
            parsed = cache[(obj, style)] = original(obj, style)
            return parsed

    setattr(parse_from_object, _CACHED_MARK, True)
    docstring_parser.parse_from_object = parse_from_object
