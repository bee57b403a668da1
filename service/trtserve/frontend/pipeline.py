"""One model as a front end serves it: the handler's pre/post-processing around the engine core.

A request's validated tensors become engine rows here (the handler's ``preprocess``, its
``chunk`` for a request whose ``long_text`` is ``"chunk"``, or the tensors themselves; a model
without a batch dimension gets one row), cross to the engine core
(:class:`~trtserve.ipc.client.EngineClient`), and come back to be cut into the
response tensors (``postprocess``, or the ``gather`` of a :class:`~trtserve.handlers.Fanout`).
The handler contract is in :mod:`trtserve.handlers`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from trtserve.datatypes import Tensors
from trtserve.errors import BackendError, InvalidRequest, TrtServeError
from trtserve.handlers import Fanout, Token, load_handler
from trtserve.ipc.admission import UNTIMED, Ask
from trtserve.protocol.parameters import CHUNK, TRUNCATE
from trtserve.spec import ModelSpec

if TYPE_CHECKING:
    from trtserve.ipc.engine import Engine

T = TypeVar("T")


class FrontendModel:
    """A model served through the engine core.

    Args:
        spec: the model's configuration (as the engine core loaded it).
        engine: the connection to the engine core.
        pool: executor for handler pre/post-processing.

    Raises:
        ImportError, AttributeError, and whatever the handler's constructor raises: the
            model's handler cannot be loaded (the front end then reports the model
            unavailable with that reason).
    """

    def __init__(self, spec: ModelSpec, engine: Engine, *, pool: Executor) -> None:
        self.spec = spec
        self.engine = engine
        self.pool = pool
        self.handler = load_handler(spec)

    async def infer(
        self, inputs: Tensors, ask: Ask = UNTIMED, *, version: str | None = None, long_text: str = TRUNCATE,
    ) -> tuple[Tensors, float, str]:
        """Run one request through pre-processing, the engine core and post-processing.

        Args:
            inputs: validated request tensors (batch on axis 0 for a batched model).
            ask: the request's timing (:class:`~trtserve.ipc.admission.Ask`; default
                :data:`~trtserve.ipc.admission.UNTIMED`, a tool's call in process).
            version: the version to run (default: this spec's); empty: the highest version
                the engine core serves when the rows arrive, so that a request sent across a
                reload's switch runs on whichever side of it the core is.
            long_text: ``"truncate"`` (the handler's ``preprocess``) or ``"chunk"`` (its
                ``chunk``: long texts embedded whole), :data:`~trtserve.protocol.parameters.LONG_TEXT`.

        Returns:
            (outputs, deadline, version): output name → array (batch on axis 0 for a batched
            model), the deadline the engine core resolved for the request (monotonic
            seconds), and the version that answered.

        Raises:
            InvalidRequest, QueueFull, RequestTimeout, ShuttingDown, BackendError,
            ModelNotReady: from the handler (see :mod:`trtserve.handlers`) or the engine core;
                InvalidRequest also for ``long_text`` ``"chunk"`` to a model whose handler
                has no ``chunk``.
        """
        gather = None
        preprocess = self._preprocess(long_text)
        if preprocess is not None:
            pre = await self._on_pool(preprocess, inputs)
            if isinstance(pre, Fanout):
                segments, gather = pre.segments, pre.gather
            else:
                segments = [pre] if isinstance(pre, dict) else list(pre)
        elif self.spec.batched:
            segments = [inputs]
        else:
            segments = [{name: arr[np.newaxis] for name, arr in inputs.items()}]
        outputs, deadline, answered = await self.engine.infer(
            self.spec.name, self.spec.version if version is None else version, segments, ask,
        )
        if gather is not None:
            return await self._on_pool(gather, outputs), deadline, answered
        if self.handler is not None:
            return await self._on_pool(self.handler.postprocess, inputs, outputs), deadline, answered
        out = outputs[0]
        if not self.spec.batched:
            out = {name: arr[0] for name, arr in out.items()}
        return out, deadline, answered

    @property
    def tokenizes(self) -> bool:
        """Whether the model's handler has a tokenizer (``tokenize``)."""
        return hasattr(self.handler, "tokenize")

    async def tokenize(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[Token]]:
        """Each whole text's tokens as the model's handler makes them (:mod:`trtserve.handlers`),
        on the CPU pool; nothing goes to the engine core. Only for a model that :attr:`tokenizes`.

        Raises:
            InvalidRequest (INVALID_ARGUMENT): from the handler (a text over its bound).
            BackendError (INTERNAL): the handler failed otherwise.
        """
        handler: Any = self.handler  # one that tokenizes: the caller checked
        return await self._on_pool(functools.partial(handler.tokenize, texts, add_special_tokens=add_special_tokens))

    def _preprocess(self, long_text: str) -> Callable[[Tensors], Any] | None:
        """The handler's stage that makes a request's engine rows (None: the tensors are the rows)."""
        if long_text != CHUNK:
            return None if self.handler is None else self.handler.preprocess
        chunk = getattr(self.handler, "chunk", None)
        if chunk is None:
            raise InvalidRequest(f"model '{self.spec.name}' cannot embed a long text whole (it has no handler with a "
                                 f"chunk stage): send long_text '{TRUNCATE}' or none")
        return chunk

    async def _on_pool(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        except TrtServeError:
            raise
        except Exception as exc:
            raise BackendError(
                f"handler {getattr(fn, '__name__', 'stage')} of model '{self.spec.name}' failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
