"""``trtserve.v1.Tokenizer`` in a front end: a model's tokens of texts, made by its handler on the
front end's CPU pool (:meth:`FrontendState.tokenize <trtserve.frontend.state.FrontendState.tokenize>`),
the gRPC twin of HTTP ``POST /tokenize``. Errors map as the inference service's: NOT_FOUND for a
model without a tokenizer, INVALID_ARGUMENT for a text over the model's bound."""

from __future__ import annotations

from typing import Any

from trtserve._proto.trtserve.v1 import tokenizer_pb2 as pb
from trtserve._proto.trtserve.v1 import tokenizer_pb2_grpc as pb_grpc
from trtserve.frontend.state import FrontendState


class TokenizerService(pb_grpc.TokenizerServicer):
    """The tokenizer service of one front end.

    Args:
        state: the front end's served models.
        call: the inference service's error-mapping helper (``InferenceService._call``).
    """

    def __init__(self, state: FrontendState, call: Any) -> None:
        self.state = state
        self._call = call

    async def Tokenize(self, request: pb.TokenizeRequest, context: Any) -> pb.TokenizeResponse:
        """Each input's tokens, whole (no truncation), with the special tokens unless
        ``add_special_tokens`` is false."""
        special = request.add_special_tokens if request.HasField("add_special_tokens") else True
        texts = await self._call(context, self.state.tokenize, request.model_name, request.model_version,
                                 list(request.inputs), special)
        response = pb.TokenizeResponse()
        for tokens in texts:
            out = response.texts.add(count=len(tokens))
            for t in tokens:
                token = out.tokens.add(id=t.id, text=t.text, special=t.special)
                if t.start is not None:
                    token.start, token.stop = t.start, t.stop
        return response
