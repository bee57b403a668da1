"""``trtserve.v1.ModelControl`` in a front end: forwarded to the engine core, which owns every
dispatcher's policy (:mod:`trtserve.engine.policy_update`). Errors map as the inference service's:
NOT_FOUND, UNAVAILABLE, INVALID_ARGUMENT naming the field."""

from __future__ import annotations

from typing import Any

from trtserve._proto.trtserve.v1 import control_pb2 as pb
from trtserve._proto.trtserve.v1 import control_pb2_grpc as pb_grpc
from trtserve.ipc.engine import Engine
from trtserve.ipc.queries import GetPolicy, SetPolicy


class ModelControlService(pb_grpc.ModelControlServicer):
    """The admin service of one front end.

    Args:
        engine: the connection to the engine core.
        call: the inference service's error-mapping helper (``InferenceService._call``).
    """

    def __init__(self, engine: Engine, call: Any) -> None:
        self.engine = engine
        self._call = call

    async def GetPolicy(self, request: pb.GetPolicyRequest, context: Any) -> pb.BatchingPolicy:
        """The batching policy in force (:func:`~trtserve.engine.policy_update.get_policy`)."""
        data = await self._call(context, self.engine.query, GetPolicy(request.SerializeToString()))
        return pb.BatchingPolicy.FromString(data)

    async def SetPolicy(self, request: pb.SetPolicyRequest, context: Any) -> pb.BatchingPolicy:
        """Change the fields in ``update_mask`` from the next batch on; answers the policy now in
        force (:func:`~trtserve.engine.policy_update.set_policy`)."""
        data = await self._call(context, self.engine.query, SetPolicy(request.SerializeToString()))
        return pb.BatchingPolicy.FromString(data)
