"""Whole-server answers built in the engine core: ModelStatistics, RepositoryIndex, readiness.

The engine core owns every model's batching numbers
(:class:`~trtserve.batching.stats.DispatchStats`) and the request outcomes that every front end
ships to it (:class:`~trtserve.engine.metrics.RequestStats`), so these answers are the same
whichever front end a client reached.
"""

from __future__ import annotations

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.engine.metrics import ModelRequests, RequestStats
from trtserve.engine.model import EngineModel
from trtserve.engine.registry import ModelRegistry
from trtserve.errors import ModelNotReady, TrtServeError
from trtserve.ipc.messages import ModelState


def model_statistics(
    registry: ModelRegistry, requests: RequestStats, name: str, version: str
) -> pb.ModelStatisticsResponse:
    """Triton's ModelStatistics for model ``name`` (every ready model when empty), one entry
    per served version (only ``version`` when given).

    Fields as Triton means them: success/fail per request (decode to answer), queue per
    request, compute_infer per request (each charged its batch's run time), batch_stats per run.
    The dispatcher's numbers (inference and execution counts, queue, compute, batch_stats)
    are each version's own; success and fail are counted per model by the front ends (a
    request may fail before any version is chosen), so each version's entry carries the
    model's totals.

    Raises:
        ModelNotFound (NOT_FOUND): no such model or version. A model that is not ready is
            left out.
    """
    names = [name] if name else sorted(registry.models)
    response = pb.ModelStatisticsResponse()
    for model in names:
        try:
            first = registry.get(model, version)  # raises for a model not served
        except ModelNotReady:
            continue
        for instance in [first] if version else list(registry.models[model].versions.values()):
            _add_version(response, requests, model, instance)
    return response


def _add_version(
    response: pb.ModelStatisticsResponse, requests: RequestStats, model: str, served: EngineModel
) -> None:
    stats = served.dispatcher.stats
    model_stats = response.model_stats.add(
        name=model,
        version=served.spec.version,
        last_inference=requests.last_inference_ms(model),
        inference_count=stats.rows,
        execution_count=stats.batches,
    )
    infer = model_stats.inference_stats
    (ok_n, ok_s), (fail_n, fail_s) = requests.models.get(model, ModelRequests()).totals()
    queue_counts, queue_s = stats.queue.snapshot()
    for field, count, seconds in (
        (infer.success, ok_n, ok_s),
        (infer.fail, fail_n, fail_s),
        (infer.queue, sum(queue_counts), queue_s),
        (infer.compute_infer, stats.request_runs, stats.request_compute_seconds),
    ):
        field.count, field.ns = count, int(seconds * 1e9)
    for size, runs in sorted(stats.batch_sizes.items()):
        batch = model_stats.batch_stats.add(batch_size=size)
        batch.compute_infer.count = runs
        batch.compute_infer.ns = int(stats.batch_seconds[size] * 1e9)


def repository_index(rows: list[tuple[str, str, ModelState, str]], ready_only: bool) -> pb.RepositoryIndexResponse:
    """Triton's RepositoryIndex from ``rows`` (name, version, state, reason: see
    :meth:`ModelLifecycle.index <trtserve.engine.lifecycle.ModelLifecycle.index>`)."""
    response = pb.RepositoryIndexResponse()
    for name, version, state, reason in rows:
        if ready_only and state is not ModelState.READY:
            continue
        response.models.add(name=name, version=version, state=state.value, reason=reason)
    return response


def model_ready(registry: ModelRegistry, name: str, version: str) -> bool:
    """ModelReady: loaded, and not every execution slot hung
    (:attr:`Dispatcher.healthy <trtserve.batching.dispatcher.Dispatcher.healthy>`), so a load
    balancer polling it routes away from a wedged model. Never raises."""
    try:
        served = registry.get(name, version)
    except TrtServeError:
        return False
    return served.dispatcher.healthy

