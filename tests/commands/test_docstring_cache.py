"""The CLI's per-process cache of attribute docstrings: the same documentation, parsed once."""

from __future__ import annotations

import docstring_parser

from lit_fgrpo.commands.docstring_cache import cache_attribute_docstrings
from lit_fgrpo.training.module_settings import ObjectiveSettings, PolicySettings


def _params(doc: docstring_parser.Docstring) -> dict[str, str | None]:
    return {p.arg_name: p.description for p in doc.params}


def test_cached_parse_equals_the_parse_and_reads_each_class_once() -> None:
    cache_attribute_docstrings()
    cache_attribute_docstrings()  # idempotent: one wrapper, not two
    cached = docstring_parser.parse_from_object
    original = cached.__wrapped__  # type: ignore[attr-defined]
    assert not hasattr(original, "__wrapped__")
    for cls in (PolicySettings, ObjectiveSettings):
        first = cached(cls)
        assert _params(first) == _params(original(cls))
        assert _params(first)["gamma" if cls is ObjectiveSettings else "model"]  # attribute docstrings are there
        assert cached(cls) is first  # the second parser build reuses the first parse


def test_an_unhashable_object_is_parsed_every_time() -> None:
    cache_attribute_docstrings()

    class Documented(dict[str, int]):
        """Short description."""

        __hash__ = None  # type: ignore[assignment]

    obj = Documented()
    assert docstring_parser.parse_from_object(obj).short_description == "Short description."
