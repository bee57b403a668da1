"""Model handlers: a model's own pre- and post-processing, beside its config.

A model may have ``engines/<model>/handler.py`` defining (``Tensors`` is ``dict[str, np.ndarray]``,
:data:`trtserve.datatypes.Tensors`)::

    class Handler:
        def __init__(self, model_dir: pathlib.Path, spec: trtserve.spec.ModelSpec): ...
        def preprocess(self, inputs: Tensors) -> list[Tensors] | Tensors: ...
        def postprocess(self, inputs: Tensors, outputs: list[Tensors]) -> Tensors: ...
        def count_tokens(self, texts: list[str], *, whole: bool = False) -> list[int]: ...  # optional
        def chunk(self, inputs: Tensors) -> Fanout: ...                   # optional
        def tokenize(self, texts: list[str], *, add_special_tokens: bool = True
                     ) -> list[list[Token]]: ...                          # optional

``preprocess`` turns one request's validated tensors into engine rows: one or more
*segments*, each a dict of engine-input name → array with rows on axis 0 (segments may differ
in their variable-length dims; the dispatcher pads to the longest row of each batch).
``postprocess`` receives one output dict per segment, in order, cut back to that segment's
rows, and returns the response tensors. Both run in the front-end processes (every core), on
their CPU pool, so tokenizing request N+1 overlaps the engine running batch N. Raising
:class:`~trtserve.errors.InvalidRequest` answers INVALID_ARGUMENT; any other exception is
INTERNAL.

**The fan-out pattern.** ``preprocess`` may instead return a :class:`Fanout`: the segments,
and a ``gather`` function that receives their outputs (one dict per segment, in order) and
returns the response tensors; ``postprocess`` is then not called. One input can so become
many engine rows (the windows of a long text, the tiles of an image): they cross to the engine
core as one request, so they share its deadline and priority, and the dispatcher batches them
with every other caller's rows; ``gather`` makes the one answer from them. The closure carries
what ``preprocess`` learned (which rows belong to which input, their weights) to ``gather``
without a second pass over the input.

``chunk``, optional, is ``preprocess`` for a request whose ``long_text`` parameter is
``"chunk"`` (:mod:`trtserve.protocol.parameters`): each text embedded whole rather than cut at
the model's window, as a :class:`Fanout`. A model whose handler lacks it refuses that request
(INVALID_ARGUMENT).

``count_tokens``, optional, gives the number of tokens the model reads for each text (after the
handler's own truncation, special tokens included; ``whole``: as ``chunk`` reads it, every
window's tokens): the OpenAI door's ``usage`` (:mod:`trtserve.frontend.http.openai`), which
reports 0 for a model whose handler lacks it. It runs on the same CPU pool, after the request
is answered.

``tokenize``, optional, gives each text's tokens as the model's tokenizer makes them, the whole
text (no truncation): ``POST /tokenize`` and the ``trtserve.v1.Tokenizer`` RPC. A model whose
handler lacks it is refused there (NOT_FOUND naming the models that have one).

The files a handler needs (a tokenizer, a vocabulary) live in the model directory, not in a
Python package: those that belong to one version (they must match its model file) in
``spec.version_dir``, the served version's directory, the others in ``model_dir``. A copy of
the model directory then serves anywhere. A constructor that raises (e.g. a file is missing)
leaves the model unavailable with that exception as the reason (UNAVAILABLE to requests).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trtserve.datatypes import Tensors
from trtserve.protocol.tokenize import Token
from trtserve.spec import ModelSpec

HANDLER_FILE = "handler.py"


@dataclass(frozen=True)
class Fanout:
    """One request's engine rows, and how their outputs become its response (the fan-out
    pattern, above).

    Attributes:
        segments: engine-input name → array, rows on axis 0, as ``preprocess`` returns them.
        gather: called with one output dict per segment (in order, cut to that segment's rows)
            on the front end's CPU pool; returns the response tensors. An
            :class:`~trtserve.errors.InvalidRequest` it raises answers INVALID_ARGUMENT, any
            other exception INTERNAL.
    """

    segments: list[Tensors]
    gather: Callable[[list[Tensors]], Tensors]


def has_handler(spec: ModelSpec) -> bool:
    """Whether the model directory holds a ``handler.py``."""
    return (spec.model_dir / HANDLER_FILE).is_file()


def load_handler(spec: ModelSpec) -> Any | None:
    """Instantiate ``Handler`` from ``<model_dir>/handler.py``, or ``None`` if there is no such file.

    Raises:
        ImportError / AttributeError: the file does not define ``Handler``; the model then
            fails to load with that reason.
    """
    if not has_handler(spec):
        return None
    path = spec.model_dir / HANDLER_FILE
    module_name = f"trtserve_handler_{spec.name}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    return module.Handler(spec.model_dir, spec)


__all__ = ["HANDLER_FILE", "Fanout", "Token", "has_handler", "load_handler"]
