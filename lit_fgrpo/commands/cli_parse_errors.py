"""jsonargparse's nested error text, rewritten as one line that names the key, the value and what is allowed.

jsonargparse reports a bad value deep in a class argument (a callback's ``sampling.n``, a ``ModelCheckpoint``
setting) as a tree: ``Parser key "trainer.callbacks":`` over ``Does not validate against any of the Union
subtypes`` over ``Problem with given class_path '...':`` over the real message, with the alternatives that were
tried (``Not a valid subclass``, ``Expected a <class 'NoneType'>``) and the whole list of callbacks as the "given
value". :func:`explain` walks that text and keeps the one branch that says what is wrong, plus the path to it:

    --trainer.callbacks[1] (RolloutCallback): sampling.n must be >= 1, got 0
    --trainer.callbacks[6] (ModelCheckpoint): every_n_train_steps: expected int or null, got x

The text format is jsonargparse's (4.3x-4.5x); anything that does not match is kept as it is, so a new format
degrades to a longer line, never to a lost message.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass, field

UNION_HEAD = "Does not validate against any of the Union subtypes"
"""First line of jsonargparse's message when no alternative of a ``X | Y`` type accepted the value."""

_NOISE = ("Not a valid subclass of", "Expected a <class 'NoneType'>", "Expected a NoneType")
"""Alternatives that only say the value is not of a type nobody meant (``None``, a bare subclass spec)."""


@dataclass
class Explained:
    """The branch of a jsonargparse error that says what is wrong.

    Attributes:
        keys: Path to the value, outermost first: ``["trainer.callbacks", "[1]", "(RolloutCallback)", "sampling"]``.
        message: What is wrong, e.g. ``"expected int, got x"``.
    """

    keys: list[str] = field(default_factory=list)
    message: str = ""

    def render(self) -> str:
        """``"--trainer.callbacks[1] (RolloutCallback): sampling: expected int, got x"``."""
        head, rest = "", []
        for key in self.keys:
            if key.startswith("["):
                head += key
            elif key.startswith("("):
                # The first class names the culprit; a nested one (a dataclass argument) is named by its key.
                head += "" if "(" in head else f" {key}"
            elif not head:
                head = f"--{key}"
            else:
                rest.append(key)
        message = self.message
        if head and message.startswith(head.split(" ")[0]):
            return message  # a settings class's own check already names the full flag (--model.policy.lora.r ...)
        owner = re.search(r"\((\w+)\)", head)
        if owner and message.startswith(f"{owner.group(1)}."):
            message = message[len(owner.group(1)) + 1 :]  # "RolloutCallback.reward_weights ..." under that class
        parts = [part for part in (head, ".".join(rest)) if part]
        return ": ".join([*parts, message])


def _dedent(text: str) -> str:
    lines = text.strip("\n").splitlines()
    indents = [len(line) - len(line.lstrip(" ")) for line in lines[1:] if line.strip()]
    cut = min(indents, default=0)
    return "\n".join([lines[0].strip(), *(line[cut:] for line in lines[1:])]) if lines else ""


def split_top_level(text: str) -> list[str]:
    """The comma-separated items of ``text`` (a list's repr without its brackets), brackets and quotes respected."""
    items, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote and text[i - 1] != "\\" else quote
        elif char in "'\"":
            quote = char
        elif char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    return [*items, tail] if tail else items


def clean_type(name: str) -> str:
    """``"<class 'int'>"`` -> ``int``; ``"typing.Literal['a', 'b']"`` -> ``one of 'a', 'b'``; NoneType -> null."""
    name = re.sub(r"<class '([\w.]+)'>", r"\1", name.strip())
    literal = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", name, flags=re.S)
    if literal:
        return "one of " + literal.group(1)
    name = name.replace("typing.", "").replace("NoneType", "null")
    return re.sub(r"\b(?:[a-z_]\w*\.)+([A-Z]\w*)", r"\1", name)  # lightning.pytorch...Callback -> Callback


def allowed_types(subtypes: str) -> str:
    """The types of a Union's ``Subtypes: [...]`` line, as ``"int or null"`` (Literal values merged)."""
    names = [clean_type(item) for item in split_top_level(subtypes.strip()[1:-1])]
    values = [name.removeprefix("one of ") for name in names if name.startswith("one of ")]
    others = [name for name in names if not name.startswith("one of ")]
    if values:
        others.append("one of " + ", ".join(values))
    return others[0] if len(others) == 1 else ", ".join(others[:-1]) + " or " + others[-1]


def _failing_element(given: str) -> tuple[int, str] | None:
    # Parsing turns the checked elements into Namespaces and leaves the failing one a dict; instantiation turns the
    # built ones into objects and leaves the failing one a Namespace. Either way it is the first "unfinished" one.
    if not (given.startswith("[") and given.endswith("]")):
        return None
    items = split_top_level(given[1:-1])
    for marker in ("{", "Namespace("):
        for index, item in enumerate(items):
            if item.startswith(marker):
                return index, item
    return None


def _union(text: str) -> Explained:
    subtypes = re.search(r"^Subtypes: (.*)$", text, flags=re.M)
    errors = re.search(r"^Errors:\n(.*?)^Given value type:", text, flags=re.M | re.S)
    given = re.search(r"^Given value: (.*)\Z", text, flags=re.M | re.S)
    given_text = given.group(1).strip() if given else ""
    alternatives = re.split(r"^  - ", errors.group(1), flags=re.M)[1:] if errors else []
    meaningful = [_dedent(alt) for alt in alternatives if not alt.strip().startswith(_NOISE)]
    # "Expected a <type>" alone only says which alternative was tried; the Subtypes line says them all at once.
    meaningful = [alt for alt in meaningful if not re.fullmatch(r"Expected a [^\n]*", alt.strip())]
    if not meaningful:
        allowed = allowed_types(subtypes.group(1)) if subtypes else "another type"
        return Explained([], f"expected {allowed}, got {given_text}")
    found = explain_text(meaningful[0])
    element = _failing_element(given_text)
    if element is not None:
        index, item = element
        prefix = [f"[{index}]"]
        owner = re.search(r"class_path='([\w.]+)'", item)
        if owner and not any(key.startswith("(") for key in found.keys):
            prefix.append(f"({owner.group(1).rsplit('.', 1)[-1]})")
        found.keys = prefix + found.keys
    return found


def explain_text(text: str) -> Explained:
    """The branch of one jsonargparse message that says what is wrong (see the module docstring)."""
    text = re.sub(r"<class '([\w.]+)'>", r"<class '\1'>", text.strip())
    key = re.match(r'Parser key "([^"]+)"(?: element (\d+))?:\s*(.*)', text, flags=re.S)
    if key:
        inner = explain_text(_dedent(key.group(3)))
        index = [f"[{int(key.group(2)) - 1}]"] if key.group(2) else []
        inner.keys = [key.group(1), *index, *inner.keys]
        return inner
    owner = re.match(r"Problem with given class_path '([^']+)':\s*(.*)", text, flags=re.S)
    if owner:
        inner = explain_text(_dedent(owner.group(2)))
        inner.keys = [f"({owner.group(1).rsplit('.', 1)[-1]})", *inner.keys]
        return inner
    if text.startswith(UNION_HEAD):
        return _union(text)
    if text.startswith("- "):
        # A value that may also be a file name: "- Expected a path but X either not accessible or invalid" and
        # then the reason it is not a value either. The path alternative is noise unless it is the only one.
        items = [item.strip() for item in re.split(r"^- ", text, flags=re.M) if item.strip()]
        kept = [item for item in items if not item.startswith("Expected a path but")] or items
        return explain_text(kept[0])
    expected = re.fullmatch(r"Expected a (.+?)\. Got value: (.*)", text, flags=re.S)
    if expected:
        return Explained([], f"expected {clean_type(expected.group(1))}, got {expected.group(2)}")
    return Explained([], text)


def instantiation_key(err: BaseException) -> str | None:
    """The setting (``trainer.callbacks``) whose classes were being built when ``err`` was raised, if known.

    An error raised in a class's ``__init__`` while jsonargparse instantiates it carries no key in its text; the key
    is the ``dest`` of the outermost ``instantiate_classes`` on the traceback.
    """
    for frame, _ in traceback.walk_tb(err.__traceback__):
        if frame.f_code.co_name == "instantiate_classes":
            dest = getattr(frame.f_locals.get("self"), "dest", None)
            if isinstance(dest, str):
                return dest
    return None


def explain(err: BaseException) -> Explained:
    """:func:`explain_text` of ``err``'s message, keyed by :func:`instantiation_key` when the text has no key."""
    text = str(getattr(err, "message", None) or err)
    found = explain_text(text)
    if not found.keys or found.keys[0].startswith(("[", "(")):
        key = instantiation_key(err)
        if key:
            found.keys = [key, *found.keys]
    return found
