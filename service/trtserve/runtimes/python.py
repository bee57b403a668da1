"""Python models: a class with a batched ``predict``, served like any engine.

``engines/<model>/<version>/model.py`` defines a class named ``Model``::

    class Model:
        def setup(self, config: trtserve.spec.ModelSpec) -> None:
            ...  # once per execution slot, before its first batch: load weights, pick a device

        def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            ...  # one batch

``predict`` receives every configured input with the batch's rows on axis 0 (no batch axis for
a model with ``max_batch_size: 0``): numeric inputs in the configured dtype, BYTES inputs as
object arrays of ``bytes``, variable (-1) dims padded to the longest row with ``pad_value``
(``b""`` for BYTES). The arrays are read-only and may be reused after the call (copy what
you keep). It returns every configured output with the
configured dtype (BYTES: an object array of ``bytes``), the same number of rows on axis 0 and
the configured fixed dims; other keys are ignored. An exception in ``predict``, or a missing or
mismatched output, raises :class:`~trtserve.errors.BackendError` (gRPC ``INTERNAL``) for every
request of that batch, with the exception's type and text or the output's expected and returned
dtype and shape; the slot keeps serving.

Execution, chosen by the config's ``isolation`` parameter:

``thread`` (the default)
    Each execution slot (``instance_group.count``) has its own ``Model`` instance, called on
    the slot's own thread. Right for models whose work releases the GIL (NumPy, PyTorch).
``process`` (with ``instance_group [ { kind: KIND_CPU } ]``)
    Each slot's instance lives in its own worker process (``multiprocessing``, spawn), so
    pure-Python models do not hold the server's GIL. Numeric tensors cross in shared memory
    both ways; BYTES tensors are pickled over the pipe (:mod:`.shared_tensors`). A worker that
    dies fails the batch it was running and is started again; so does one whose batch runs past
    the dispatcher's hang limit (it is killed: :meth:`PythonBackend.abort`). A worker exits as
    soon as the server process is gone, even mid-batch. The shared memory has no name (a
    ``memfd``, its descriptor passed over the pipe), so however the processes end nothing is
    left in ``/dev/shm``. A program that embeds the server (rather than ``trtserve serve``)
    needs spawn's usual ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from trtserve._proto.inference import model_config_pb2 as mc
from trtserve.datatypes import Datatype, Tensors
from trtserve.errors import BackendError
from trtserve.runtimes.base import Batch, StagingBuffers, pack
from trtserve.runtimes.shared_tensors import Arena, Attachment, send_with_fd
from trtserve.runtimes.threads import on_slot
from trtserve.spec import ModelSpec

log = logging.getLogger(__name__)

MODEL_FILE = "model.py"
MODEL_CLASS = "Model"
ISOLATIONS = ("thread", "process")
STOP_TIMEOUT_S = 10.0  # how long a worker process may take to exit before it is killed


def isolation(spec: ModelSpec) -> str:
    """The model's ``isolation`` parameter: ``"thread"`` (default) or ``"process"``.

    Raises:
        BackendError: another value, or ``process`` without an ``instance_group`` of kind
            ``KIND_CPU``.
    """
    value = spec.parameters.get("isolation", "thread")
    if value not in ISOLATIONS:
        raise BackendError(f"parameter isolation is '{value}'; expected one of {list(ISOLATIONS)}")
    groups = spec.config.instance_group if spec.config is not None else ()
    if value == "process" and not any(g.kind == mc.ModelInstanceGroup.KIND_CPU for g in groups):
        raise BackendError("isolation 'process' needs instance_group [ { kind: KIND_CPU } ]")
    return value


class PythonBackend:
    """A ``model.py`` served through the batching dispatcher (see the module docstring).

    Its engine tensors are the config's own (``spec.inputs``/``spec.outputs``). Each slot has
    one thread; in process isolation that thread hands the batch to the slot's worker process
    and waits for the answer.

    Args:
        spec: the model's configuration; ``setup`` receives it.

    Attributes:
        models: in thread isolation, each slot's ``Model`` instance, by slot, for tests and
            introspection (e.g. ``engines/slow``'s ``executed`` count); empty in process
            isolation, where the instances live in the worker processes.

    Raises:
        BackendError: bad ``isolation`` parameter, ``model.py`` missing or without a ``Model``
            class, or ``setup`` raised (the model is then unavailable with this reason).
    """

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.inputs = spec.inputs
        self.outputs = spec.outputs
        self.slots = spec.instances
        mode = isolation(spec)
        self._staging = [StagingBuffers() for _ in range(self.slots)]
        self._threads = [
            ThreadPoolExecutor(1, thread_name_prefix=f"python-{spec.name}-slot{i}") for i in range(self.slots)
        ]
        self._workers: list[_ThreadWorker | _ProcessWorker] = []
        try:
            if mode == "thread":
                cls = model_class(spec)
                self._workers = [_ThreadWorker(spec, new_model(cls, spec)) for _ in range(self.slots)]
            else:
                for slot in range(self.slots):
                    self._workers.append(_ProcessWorker(spec, slot))
        except BaseException:
            self._shutdown()
            raise
        self.models = tuple(w.model for w in self._workers if isinstance(w, _ThreadWorker))

    def prepare(self, segment: Tensors) -> Tensors:
        """Python models take BYTES as ``bytes``, as decoded: nothing to convert."""
        return segment

    async def run(self, slot: int, batch: Batch) -> Tensors:
        """Run ``predict`` on ``batch`` in slot ``slot``. See :class:`~trtserve.runtimes.base.Backend`.

        Raises:
            BackendError: ``predict`` raised or returned a wrong output, or the slot's worker
                process died or was killed by :meth:`abort` (it is restarted first).
        """
        return await on_slot(self._threads[slot], self._run, slot, batch)

    def _run(self, slot: int, batch: Batch) -> Tensors:
        feed = pack(batch, self.inputs, self._staging[slot], self.spec.policy.pad_value)
        if not self.spec.batched:
            feed = {name: arr[0] for name, arr in feed.items()}
        feed = {name: _read_only(arr) for name, arr in feed.items()}
        outputs = self._workers[slot].predict(feed, batch.rows)
        if not self.spec.batched:
            outputs = {name: arr[np.newaxis] for name, arr in outputs.items()}
        return outputs

    def abort(self, slot: int, reason: str) -> bool:
        """Stop the batch running on ``slot`` (see :class:`~trtserve.runtimes.base.Abortable`).

        In process isolation the slot's worker is killed: its ``run`` raises
        :class:`~trtserve.errors.BackendError` with ``reason``, once a new worker has been
        started. A thread cannot be stopped: in thread isolation this returns False.
        """
        return self._workers[slot].abort(reason)

    async def aclose(self) -> None:
        """Stop the worker processes (waiting for each to exit) and the slot threads."""
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        for worker in self._workers:
            worker.close()
        for thread in self._threads:
            thread.shutdown(wait=True)


def model_class(spec: ModelSpec) -> type:
    """Import ``<version_dir>/model.py`` and return its ``Model`` class.

    Raises:
        BackendError: the file is missing, fails to import, or defines no ``Model``.
    """
    path = spec.version_dir / MODEL_FILE
    name = f"trtserve_model_{spec.name}"
    try:
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pickle look its classes up there
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise BackendError(f"cannot load {path}: {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, MODEL_CLASS, None)
    if not isinstance(cls, type):
        raise BackendError(f"{path} defines no class '{MODEL_CLASS}'")
    return cls


def new_model(cls: type, spec: ModelSpec) -> Any:
    """An instance of ``cls`` after ``setup(spec)``.

    Raises:
        BackendError: the constructor or ``setup`` raised (type and text in the message).
    """
    try:
        model = cls()
        model.setup(spec)
    except Exception as exc:
        raise BackendError(f"setup of model '{spec.name}' failed: {type(exc).__name__}: {exc}") from exc
    return model


def predict(model: Any, inputs: Tensors, spec: ModelSpec, rows: int) -> Tensors:
    """``model.predict(inputs)``, checked against the configured outputs.

    Returns:
        Each configured output (and nothing else), ``rows`` rows on axis 0 for a batched model.

    Raises:
        BackendError: ``predict`` raised (the message has the exception's type and text), or
            returned no dict, or an output is missing or has the wrong dtype, row count or
            fixed dim (the message names the output, what was expected and what came).
    """
    try:
        returned = model.predict(inputs)
    except Exception as exc:
        raise BackendError(f"predict of model '{spec.name}' raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(returned, dict):
        raise BackendError(
            f"predict of model '{spec.name}' returned {type(returned).__name__}; "
            "expected a dict of output name to numpy array"
        )
    lead = (rows,) if spec.batched else ()
    outputs: Tensors = {}
    for t in spec.outputs:
        arr = returned.get(t.name)
        want = (*lead, *t.dims)
        expected = f"{t.datatype.name} ({t.datatype.numpy}) of shape {list(want)}"
        if arr is None:
            raise BackendError(
                f"predict of model '{spec.name}' returned no output '{t.name}' (expected {expected}; "
                f"it returned {sorted(returned)})"
            )
        if not (isinstance(arr, np.ndarray) and _matches(arr, t.datatype, want)):
            got = f"{arr.dtype} of shape {list(arr.shape)}" if isinstance(arr, np.ndarray) else type(arr).__name__
            raise BackendError(
                f"predict of model '{spec.name}' output '{t.name}': expected {expected}, returned {got}"
            )
        outputs[t.name] = arr
    return outputs


def _matches(arr: np.ndarray, datatype: Datatype, shape: tuple[int, ...]) -> bool:
    """Whether ``arr`` has ``datatype`` (BYTES: any bytes/str array, as the codec takes) and
    ``shape`` (-1: any size)."""
    if datatype.name == "BYTES":
        dtype_ok = arr.dtype.kind in "OSU"
    else:
        dtype_ok = arr.dtype == datatype.numpy
    return dtype_ok and arr.ndim == len(shape) and all(d in (-1, n) for d, n in zip(shape, arr.shape))


def _read_only(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


class _ThreadWorker:
    """One slot's ``Model`` instance, called on the slot's thread."""

    def __init__(self, spec: ModelSpec, model: Any) -> None:
        self.spec = spec
        self.model = model

    def predict(self, inputs: Tensors, rows: int) -> Tensors:
        outputs = predict(self.model, inputs, self.spec, rows)
        # Packed inputs live in the slot's staging buffers, which the next batch overwrites while
        # this one's answers may still be serialised: an output that views an input is copied.
        return {
            name: arr.copy() if any(np.may_share_memory(arr, x) for x in inputs.values()) else arr
            for name, arr in outputs.items()
        }

    def abort(self, reason: str) -> bool:
        """A thread cannot be stopped: the slot stays busy until ``predict`` returns."""
        return False

    def close(self) -> None:
        """Nothing to release: the instance goes with the backend."""


class _ProcessWorker:
    """One slot's ``Model`` instance in a worker process of its own, fed through shared memory.

    Invariants: ``predict`` is called only from the slot's thread, ``abort`` from any thread;
    ``_process`` is ``None`` only after a worker died and could not be started again (the next
    batch tries again). Each worker gets shared memory blocks of its own (``_start``).
    """

    def __init__(self, spec: ModelSpec, slot: int) -> None:
        self.spec = spec
        self.slot = slot
        self._lock = threading.Lock()  # guards _process between the slot's thread and abort()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._aborted: str | None = None  # why the running batch's worker was killed
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._inputs = Arena()  # written here, read by the worker
        self._outputs = Attachment()  # written by the worker, read here
        config = self.spec.config.SerializeToString() if self.spec.config is not None else None
        process = ctx.Process(
            target=_serve,
            args=(child, replace(self.spec, config=None), config),  # protobuf messages do not pickle
            name=f"trtserve-{self.spec.name}-slot{self.slot}",
            daemon=True,
        )
        process.start()
        child.close()  # so that the worker's death reads as EOF here
        with self._lock:
            self._process = process
        try:
            kind, detail = self._conn.recv()
        except EOFError:
            raise BackendError(
                f"worker process for slot {self.slot} exited during setup (exit code {self._reap()})"
            ) from None
        if kind == "error":
            self._reap()
            raise BackendError(detail)

    def predict(self, inputs: Tensors, rows: int) -> Tensors:
        self._aborted = None  # abort() is only called while a batch runs: none does now
        if self._process is not None and not self._process.is_alive():
            # Died between batches: no batch was lost, so replace it quietly.
            code = self._reap()
            log.warning("%s: worker process for slot %d died idle (exit code %s); restarting",
                        self.spec.name, self.slot, code)
        if self._process is None:
            self._start()
        packet, fd = self._inputs.write(inputs)
        try:
            send_with_fd(self._conn, (packet, rows), fd)
            kind, detail = self._conn.recv()
            if kind == "ok":
                return self._outputs.read(detail, self._conn)
        except (EOFError, OSError):
            code = self._reap()
            if self._aborted is not None:
                died = f"{self._aborted}: worker process for slot {self.slot} killed (exit code {code})"
            else:
                died = f"worker process for slot {self.slot} died (exit code {code})"
            log.warning("%s: %s while running a batch of %d rows; restarting", self.spec.name, died, rows)
            try:
                self._start()
            except BackendError as exc:
                raise BackendError(f"{died}; restart failed: {exc}") from None
            raise BackendError(f"{died}; restarted") from None
        raise BackendError(detail)

    def abort(self, reason: str) -> bool:
        """Kill the worker (from any thread, without waiting): the batch it runs fails with
        ``reason`` and the slot's thread starts a new worker."""
        with self._lock:
            if self._process is None:
                return False
            self._aborted = reason
            self._process.kill()
        return True

    def _reap(self) -> int | None:
        """Wait for the worker to exit (killing it after ``STOP_TIMEOUT_S``); its exit code."""
        with self._lock:
            process, self._process = self._process, None
        assert process is not None
        process.join(STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()
        self._conn.close()
        self._inputs.close()
        self._outputs.close()
        return process.exitcode

    def close(self) -> None:
        """Ask the worker to exit, wait for it, and unmap both shared memory blocks."""
        if self._process is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass  # already dead
            self._reap()


def _serve(conn: Connection, spec: ModelSpec, config: bytes | None) -> None:
    """A worker process: set up the model, then run the batches the server sends until ``None``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when its workers stop
    threading.Thread(target=_exit_with_server, name="exit-with-server", daemon=True).start()
    if config is not None:
        spec = replace(spec, config=mc.ModelConfig.FromString(config))
    try:
        model = new_model(model_class(spec), spec)
    except BackendError as exc:
        conn.send(("error", str(exc)))
        return
    conn.send(("ready", None))
    inputs, outputs = Attachment(), Arena()
    try:
        while (message := conn.recv()) is not None:
            packet, rows = message
            tensors = inputs.read(packet, conn)
            try:
                result, fd = outputs.write(predict(model, tensors, spec, rows))
                reply: tuple[str, object] = ("ok", result)
            except BackendError as exc:
                reply, fd = ("error", str(exc)), None
            send_with_fd(conn, reply, fd)
    except (EOFError, OSError):
        pass  # the server went away without a word


def _exit_with_server() -> None:
    """Exit as soon as the server process is gone (killed, or ended with ``os._exit`` on a
    second signal), even in the middle of a batch that would take an hour: a worker must never
    outlive its server."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)
