"""Test doubles and fixtures of trtserve, public for its tests, the bench harness and anyone
testing code against trtserve (as ``trio.testing`` is): nothing of the served product imports
this package (an import contract in ``pyproject.toml`` says so).

- :class:`FakeClock` and :func:`settle`: time that moves only when told to (:mod:`.clock`).
- :class:`FakeBackend`: a backend whose batches take scripted fake time, with fault injection;
  :class:`FakeHost` and :class:`HostCost`: the host thread's CPU in fake time; :func:`affine`
  run times; :func:`rows` for its inputs (:mod:`.backend`). The dispatcher tests and the
  dispatch-policy simulator (:mod:`trtserve.harness.simulator`) run on them.
- :class:`ChildServer` and :class:`ServerProcess`: a server as a child process on 127.0.0.1
  (:mod:`.child_server`).
- :mod:`.redis_server`: a real redis-server on 127.0.0.1 at a free port (the queue door's tests and
  the bench's ``queue`` mode); imported by name, so this package does not need redis-py.
- :mod:`.models`: small ONNX models and their ``config.pbtxt`` (``onnx`` needed), which
  ``make engine`` builds into ``engines/`` and tests write into temporary repositories.
"""

from trtserve.testing.backend import FakeBackend, FakeHost, HostCost, affine, rows
from trtserve.testing.child_server import ChildServer, ServerProcess
from trtserve.testing.clock import FakeClock, settle

__all__ = [
    "ChildServer",
    "FakeBackend",
    "FakeClock",
    "FakeHost",
    "HostCost",
    "ServerProcess",
    "affine",
    "rows",
    "settle",
]
