"""``POST /tokenize`` in the shape Text Embeddings Inference gives it, with a ``model`` field for
a server of many models.

The body ``{"inputs": str | [str], "add_special_tokens"?: bool, "model"?: str}`` asks for the
tokens of each string (``add_special_tokens`` true by default: [CLS] and [SEP] for minilm;
``model`` may be left out where one served model has a tokenizer). The answer lists, per input in
order, its tokens ``{"id", "text", "special", "start", "stop"}`` (``start``/``stop``: character
offsets into the input, null for a special token); a text's token count is its list's length.
Each text is tokenized whole, without the model's truncation. ``null`` for an optional field is
the field left out; any other field is refused.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from trtserve.errors import InvalidRequest

_FIELDS = ("inputs", "add_special_tokens", "model")


class Token(NamedTuple):
    """One token of a text as the model's tokenizer makes it (what ``POST /tokenize`` lists)."""

    id: int
    """Its index in the tokenizer's vocabulary."""
    text: str
    """The token as the vocabulary spells it (``##ing`` for a word piece that continues a word)."""
    special: bool
    """Added by the tokenizer ([CLS], [SEP]), not read from the text."""
    start: int | None
    """Offset of its first character in the text (Python string index); None for a special token."""
    stop: int | None
    """Offset one past its last character; None for a special token."""


def parse_tokenize(doc: dict[str, Any]) -> tuple[str, list[str], bool]:
    """(model or "", texts, add_special_tokens) of a ``/tokenize`` body.

    Raises:
        InvalidRequest (HTTP 400): an unknown field; ``inputs`` not a string or a non-empty list
            of strings; ``add_special_tokens`` not a boolean; ``model`` not a string.
    """
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}: /tokenize reads {', '.join(_FIELDS)}")
    doc = {k: v for k, v in doc.items() if v is not None}
    inputs = doc.get("inputs")
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidRequest("'inputs' must be a string or a non-empty list of strings")
    special = doc.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise InvalidRequest(f"'add_special_tokens' must be true or false, got {special!r}")
    model = doc.get("model", "")
    if not isinstance(model, str):
        raise InvalidRequest("'model' must be the name of a served model")
    return model, texts, special


def tokens_body(tokens: list[list[Token]]) -> list[list[dict[str, Any]]]:
    """The answer: per input, its tokens as ``{"id", "text", "special", "start", "stop"}``."""
    return [[t._asdict() for t in text] for text in tokens]


__all__ = ["Token", "parse_tokenize", "tokens_body"]
