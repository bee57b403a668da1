"""The model repository: ``engines/<model>/config.pbtxt`` + ``<version>/model.*`` (Triton's layout).

:func:`load_specs` parses one model's ``config.pbtxt`` (protobuf text format) into the
project's ``inference.ModelConfig`` message and validates it into one immutable
:class:`~trtserve.spec.ModelSpec` per version served (``version_policy``). :class:`Repository` loads every model it finds; a model
whose config or file is broken is kept as *unavailable* with the reason (reported by
ModelReady, ModelMetadata and RepositoryIndex) while the other models serve. Which models are
loaded when (model control modes, polling) is :mod:`trtserve.engine.lifecycle`'s.
"""

from __future__ import annotations

import asyncio
import ctypes
import enum
import gc
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path

from google.protobuf import text_format

from ._proto.inference import model_config_pb2 as mc
from .config import BatchingPolicy, QueuePolicy, TimeoutAction
from .clock import Clock
from .errors import ModelNotFound, ModelNotReady
from .engine.model import EngineModel
from .handlers import HANDLER_FILE
from .protocol.datatypes import BY_CONFIG_NAME
from .spec import ModelSpec, TensorSpec

log = logging.getLogger(__name__)

CONFIG_FILE = "config.pbtxt"

PLATFORMS = {
    # platform or backend name in config.pbtxt → trtserve platform
    "onnxruntime_onnx": "onnxruntime_onnx",
    "onnxruntime": "onnxruntime_onnx",
    "python": "python",
    "tensorrt_plan": "tensorrt_plan",
    "tensorrt": "tensorrt_plan",
}


class ConfigError(ValueError):
    """A model's config.pbtxt or files are invalid; the message says what and where."""


# Every config.pbtxt field trtserve acts on (dotted paths; a message field listed here is
# honoured with every field inside it). Any other field that is set makes the model
# unavailable with a sentence naming it, instead of being accepted and ignored.
HONOURED_FIELDS = frozenset({
    "name", "platform", "backend", "max_batch_size", "parameters",
    "input.name", "input.data_type", "input.dims", "input.optional",
    "output.name", "output.data_type", "output.dims",
    "instance_group.name", "instance_group.count", "instance_group.kind",
    "dynamic_batching.preferred_batch_size", "dynamic_batching.max_queue_delay_microseconds",
    "dynamic_batching.priority_levels", "dynamic_batching.default_priority_level",
    "dynamic_batching.default_queue_policy", "dynamic_batching.priority_queue_policy",
    "version_policy.latest.num_versions", "version_policy.all", "version_policy.specific.versions",
})
# Messages whose presence alone means something (``dynamic_batching { }``, ``latest { }``).
HONOURED_CONTAINERS = frozenset({"input", "output", "instance_group", "dynamic_batching", "version_policy", "version_policy.latest",
                                 "version_policy.specific"})
# The ``parameters`` keys trtserve itself reads (repository, dispatcher, runtimes, warm-up).
# Any other key is for the model's own code: a handler or a Python model reads it from
# ``spec.parameters``; a model with neither would ignore it, so it is refused.
SERVER_PARAMETERS = frozenset({
    "batching", "adaptive_batch_size", "latency_budget_us", "priority_aging_us", "length_bucketing",
    "pad_value", "split_oversized_requests", "warmup_length",
    "ort_cpu_mem_arena", "ort_mem_pattern", "ort_intra_op_spinning", "isolation",
})


def unsupported_fields(message: object, prefix: str = "") -> list[str]:
    """The fields set in a ``ModelConfig`` (or one of its parts) that trtserve does not act
    on, as dotted paths (``optimization``, ``input.reshape``, ``sequence_batching``)."""
    out: list[str] = []
    for field, value in message.ListFields():  # type: ignore[attr-defined]
        path = f"{prefix}{field.name}"
        if path in HONOURED_FIELDS:
            continue
        if path in HONOURED_CONTAINERS:
            items = [value] if hasattr(value, "ListFields") else value  # one message, or repeated
            for item in items:
                out += [p for p in unsupported_fields(item, path + ".") if p not in out]
        elif path not in out:
            out.append(path)
    return out


def read_config(model_dir: Path) -> mc.ModelConfig:
    """The ``model_dir/config.pbtxt`` message, as written (protobuf text format).

    Raises:
        ConfigError: unreadable or unparsable (the message names the file).
    """
    path = model_dir / CONFIG_FILE
    try:
        return text_format.Parse(path.read_text(), mc.ModelConfig())
    except (OSError, text_format.ParseError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def load_spec(model_dir: Path) -> ModelSpec:
    """The spec of the highest version :func:`load_specs` serves (for the tools, which run
    one version of a model)."""
    return load_specs(model_dir)[-1]


def load_specs(model_dir: Path, config: mc.ModelConfig | None = None) -> list[ModelSpec]:
    """Parse and validate a model's config and build one spec per version it serves.

    Which versions are served follows ``version_policy`` (:func:`served_versions`). The
    platform comes from ``platform`` or ``backend``; with neither it is inferred from the
    model file present (``model.onnx`` → onnxruntime_onnx, ``model.py`` → python,
    ``model.plan`` → tensorrt_plan). A tensorrt_plan model whose version directory also holds
    ``model.onnx`` becomes onnxruntime_onnx on a machine without TensorRT or a CUDA device
    (see ``_platform``).

    Args:
        model_dir: ``engines/<model>``.
        config: a config to use instead of ``config.pbtxt`` (RepositoryModelLoad's ``config``
            parameter); audited the same way.

    Returns:
        The specs, ascending by version.

    Raises:
        ConfigError: unreadable or invalid config (the message names the file and field),
            no version directory, or a version the policy names that does not exist.
    """
    path = model_dir / CONFIG_FILE
    if config is None:
        config = read_config(model_dir)
    else:
        path = model_dir / "(the load request's config)"
    name = config.name or model_dir.name
    if name != model_dir.name:
        raise ConfigError(f"{path}: name '{config.name}' differs from its directory '{model_dir.name}'")
    config.name = name
    unsupported = unsupported_fields(config)
    if unsupported:
        raise ConfigError(
            f"{path}: trtserve does not support {', '.join(unsupported)}; remove "
            f"{'it' if len(unsupported) == 1 else 'them'} (a field it cannot honour is refused, not ignored)"
        )
    available = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if not available:
        raise ConfigError(f"{model_dir}: no version directory (e.g. {model_dir}/1/)")
    return [_version_spec(config, model_dir, v, path) for v in served_versions(config.version_policy, available, path)]


def served_versions(policy: mc.ModelVersionPolicy, available: list[int], path: Path) -> list[int]:
    """The versions a ``version_policy`` serves out of the ``available`` version directories
    (ascending), with Triton's meanings: ``latest { num_versions: n }`` the n highest (the
    default, n = 1), ``all`` every one, ``specific { versions: [...] }`` exactly those.

    Raises:
        ConfigError: a specific version without its directory.
    """
    kind = policy.WhichOneof("policy_choice")
    if kind == "all":
        return available
    if kind == "specific":
        wanted = sorted(set(int(v) for v in policy.specific.versions))
        missing = [v for v in wanted if v not in available]
        if not wanted:
            raise ConfigError(f"{path}: version_policy specific lists no versions (the model has {available})")
        if missing:
            raise ConfigError(
                f"{path}: version_policy specific names versions {missing} with no directory (the model has {available})"
            )
        return wanted
    return available[-(policy.latest.num_versions or 1):]  # latest { } without a number: 1, as Triton


def _version_spec(config: mc.ModelConfig, model_dir: Path, version: int, path: Path) -> ModelSpec:
    config = mc.ModelConfig.FromString(config.SerializeToString())  # each version owns its message
    version_dir = model_dir / str(version)
    platform = _platform(config, version_dir, path)
    config.platform = platform
    if config.max_batch_size < 0:
        raise ConfigError(f"{path}: max_batch_size must be >= 0, got {config.max_batch_size}")
    inputs = tuple(_tensor(t, path, "input") for t in config.input)
    outputs = tuple(_tensor(t, path, "output") for t in config.output)
    if not inputs or not outputs:
        raise ConfigError(f"{path}: a model needs at least one input and one output")
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    foreign = sorted(set(parameters) - SERVER_PARAMETERS)
    if foreign and platform != "python" and not (model_dir / HANDLER_FILE).is_file():
        raise ConfigError(
            f"{path}: parameters {foreign} are not ones trtserve reads ({', '.join(sorted(SERVER_PARAMETERS))}), "
            f"and the model has no handler.py or Python model to read them"
        )
    try:
        policy = _policy(config, parameters)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    instances = sum(max(g.count, 1) for g in config.instance_group) or 1
    return ModelSpec(
        name=config.name,
        version=str(version),
        platform=platform,
        inputs=inputs,
        outputs=outputs,
        policy=policy,
        instances=instances,
        model_dir=model_dir,
        version_dir=version_dir,
        parameters=parameters,
        config=config,
    )


def fingerprint(directory: Path, *, skip_versions: bool = False) -> tuple[tuple[str, int, int], ...]:
    """(relative path, size, mtime in ns) of every file under ``directory``, sorted: what
    poll mode compares between scans, and what tells a reload whether a version's files
    changed. ``skip_versions`` leaves out the numeric version directories (the model's own
    files: config, handler). Hidden entries (``.name``) are left out: a directory being
    copied in as ``.2`` before its rename to ``2`` is not a change yet."""
    out = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory)
        if (skip_versions and rel.parts[0].isdigit()) or any(part.startswith(".") for part in rel.parts):
            continue
        try:
            st = p.stat()
        except OSError:  # removed while scanning: the next scan sees the rest
            continue
        if p.is_file():
            out.append((str(rel), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _platform(config: mc.ModelConfig, version_dir: Path, path: Path) -> str:
    platform = _declared_or_found_platform(config, version_dir, path)
    if platform == "tensorrt_plan" and (version_dir / "model.onnx").is_file():
        # The GPU rule: a TensorRT model (declared, or found by its model.plan) whose version
        # directory also holds the ONNX file it was built from is served from that file by
        # ONNX Runtime where this machine has no TensorRT or no CUDA device (ModelMetadata
        # then says onnxruntime_onnx). Without model.onnx it stays tensorrt_plan and fails to
        # load with the sentence saying what is missing; the other models still serve.
        from .runtimes.tensorrt import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            log.info("%s: serving model.onnx with ONNX Runtime instead of model.plan: %s", path.parent.name, reason)
            return "onnxruntime_onnx"
    return platform


def _declared_or_found_platform(config: mc.ModelConfig, version_dir: Path, path: Path) -> str:
    declared = config.platform or config.backend
    if declared:
        if declared not in PLATFORMS:
            raise ConfigError(
                f"{path}: unknown platform/backend '{declared}'; trtserve serves {sorted(set(PLATFORMS))}"
            )
        return PLATFORMS[declared]
    for filename, platform in (("model.plan", "tensorrt_plan"), ("model.onnx", "onnxruntime_onnx"), ("model.py", "python")):
        if (version_dir / filename).exists():
            return platform
    raise ConfigError(f"{path}: no platform given and no model file in {version_dir}")


def _tensor(t: mc.ModelInput | mc.ModelOutput, path: Path, kind: str) -> TensorSpec:
    type_name = mc.DataType.Name(t.data_type)
    datatype = BY_CONFIG_NAME.get(type_name)
    if datatype is None:
        raise ConfigError(f"{path}: {kind} '{t.name}' has no valid data_type (got {type_name})")
    dims = tuple(int(d) for d in t.dims)
    if any(d == 0 or d < -1 for d in dims):
        raise ConfigError(f"{path}: {kind} '{t.name}' dims {list(dims)}: each must be -1 or >= 1")
    optional = bool(getattr(t, "optional", False))
    return TensorSpec(t.name, datatype, dims, optional)


def _queue_policy(queue: mc.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=TimeoutAction(mc.ModelQueuePolicy.TimeoutAction.Name(queue.timeout_action)),
        default_timeout=queue.default_timeout_microseconds / 1e6 if queue.default_timeout_microseconds else math.inf,
        allow_timeout_override=queue.allow_timeout_override,
        max_queue_size=queue.max_queue_size,
    )


def _policy(config: mc.ModelConfig, parameters: dict[str, str]) -> BatchingPolicy:
    """The batching policy: Triton's fields, plus trtserve's ``parameters``:
    ``batching`` ("adaptive", the default, or "fixed"), ``adaptive_batch_size`` ("true"),
    ``latency_budget_us``, ``priority_aging_us``, ``length_bucketing`` ("false" to disable),
    ``pad_value``, ``split_oversized_requests``, ``warmup_length``."""
    db = config.dynamic_batching

    def number(key: str, default: float) -> float:
        try:
            return float(parameters.get(key, default))
        except ValueError:
            raise ValueError(f"parameter {key} must be a number, got '{parameters[key]}'") from None

    batching = parameters.get("batching", "adaptive")
    if batching not in ("adaptive", "fixed"):
        raise ValueError(f"parameter batching must be 'adaptive' or 'fixed', got '{batching}'")
    return BatchingPolicy(
        max_batch_size=config.max_batch_size,
        max_queue_delay=db.max_queue_delay_microseconds / 1e6,
        preferred_batch_sizes=tuple(db.preferred_batch_size),
        priority_levels=db.priority_levels,
        default_priority=db.default_priority_level,
        default_queue=_queue_policy(db.default_queue_policy),
        priority_queues={int(level): _queue_policy(q) for level, q in db.priority_queue_policy.items()},
        priority_aging=number("priority_aging_us", 1e6) / 1e6,
        adaptive=batching == "adaptive",
        adaptive_batch_size=parameters.get("adaptive_batch_size", "false").lower() == "true",
        latency_budget=number("latency_budget_us", math.inf) / 1e6,
        length_bucketing=parameters.get("length_bucketing", "true").lower() != "false",
        pad_value=number("pad_value", 0.0),
        split_oversized=parameters.get("split_oversized_requests", "true").lower() != "false",
    )


def model_dirs(root: Path) -> list[str]:
    """Names of the directories under ``root`` that are models: those holding a
    ``config.pbtxt`` or a version directory (``1/``). One without a config is still listed, so
    that it is reported UNAVAILABLE with the reason instead of being skipped without a word."""
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir()
        if p.is_dir() and ((p / CONFIG_FILE).is_file() or any(v.is_dir() and v.name.isdigit() for v in p.iterdir()))
    )


def check_repository(root: Path) -> None:
    """Refuse to serve a repository path that does not exist or holds no model.

    Raises:
        ConfigError: one sentence saying which (the server exits non-zero with it).
    """
    if not root.is_dir():
        raise ConfigError(f"the model repository {root} is not a directory (from {Path.cwd()})")
    if not model_dirs(root):
        raise ConfigError(
            f"the model repository {root} holds no model: a model is a directory with a config.pbtxt "
            f"and a version directory (<model>/config.pbtxt, <model>/1/model.onnx)"
        )


class ModelState(enum.Enum):
    """Where a model is in its life: the strings Triton's RepositoryIndex uses."""

    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


@dataclass
class ModelEntry:
    """A model directory and what became of it.

    Attributes:
        versions: version → the instance serving it, ascending; swapped as a whole on a
            (re)load, so a request sees the old set or the new, never a mix.
        wanted: asked for (at start, or by a load not undone by an unload): strict readiness
            waits for it.
    """

    name: str
    state: ModelState
    reason: str = ""
    versions: dict[str, EngineModel] = dataclass_field(default_factory=dict)
    wanted: bool = True

    @property
    def served(self) -> EngineModel | None:
        """The highest version served (where a request without ``model_version`` goes)."""
        return next(reversed(self.versions.values()), None)

    @property
    def spec(self) -> ModelSpec | None:
        """The spec of :attr:`served`."""
        return self.served.spec if self.served is not None else None


BackendFactory = Callable[[ModelSpec], object]


class Repository:
    """The models under ``root`` that are loaded, one :class:`EngineModel` per served version.

    Touched only from the event loop. Every change of a model's state or versions calls each
    of :attr:`listeners` (the engine core pushes the new table to the front ends).

    Args:
        root: the model repository directory (``engines/``).
        clock: time source handed to each model's dispatcher.
        backend_factory: builds a model's runtime from its spec (``trtserve.runtimes.create``).
    """

    def __init__(self, root: Path, *, clock: Clock, backend_factory: BackendFactory) -> None:
        self.root = Path(root)
        self.clock = clock
        self.backend_factory = backend_factory
        self.models: dict[str, ModelEntry] = {}
        self.listeners: list[Callable[[], None]] = []
        self._warmup = asyncio.Lock()
        self._busy: dict[str, asyncio.Lock] = {}  # model → held while it loads or unloads
        self._files: dict[tuple[str, str], tuple[object, ...]] = {}  # (model, version) → files it was built from

    def discover(self) -> list[str]:
        """Names of the model directories (see :func:`model_dirs`), sorted."""
        return model_dirs(self.root)

    async def load_all(self, names: list[str] | None = None) -> None:
        """Load every model found (or ``names``); failures are recorded, never raised."""
        names = self.discover() if names is None else names
        for name in names:
            self.models.setdefault(name, ModelEntry(name, ModelState.LOADING))
        await asyncio.gather(*(self.load(name) for name in names))

    async def load(self, name: str, config: mc.ModelConfig | None = None) -> str:
        """Load model ``name``, or reload it if it is served: parse its config (or ``config``),
        build and warm every version the policy serves whose config or files changed (a
        version with neither changed keeps its instance), then switch to the new set at once.
        The versions left out finish everything queued on them and are closed (their memory
        returned). While a reload builds, the old versions keep serving.

        Returns:
            ``""`` once served, else why not (a model that was served keeps serving its old
            versions; one that was not is UNAVAILABLE with that reason). Never raises.
        """
        entry = self.models.setdefault(name, ModelEntry(name, ModelState.LOADING))
        async with self._busy.setdefault(name, asyncio.Lock()):
            entry.wanted = True
            serving = entry.state is ModelState.READY
            if not serving:
                entry.state, entry.reason = ModelState.LOADING, ""
                self._changed()
            built: list[EngineModel] = []
            files_of: dict[tuple[str, str], tuple[object, ...]] = {}
            try:
                versions: dict[str, EngineModel] = {}
                for spec in await asyncio.to_thread(load_specs, self.root / name, config):
                    key = (name, spec.version)
                    files_of[key] = (spec.config.SerializeToString(deterministic=True),
                                     fingerprint(spec.model_dir, skip_versions=True), fingerprint(spec.version_dir))
                    kept = entry.versions.get(spec.version)
                    if kept is None or self._files.get(key) != files_of[key]:
                        kept = await self._start(spec)
                        built.append(kept)
                    versions[spec.version] = kept
            except Exception as exc:  # this model stays as it was, or unavailable; never the server
                reason = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
                await asyncio.gather(*(m.aclose() for m in built))
                if not serving:
                    entry.state, entry.reason = ModelState.UNAVAILABLE, reason
                    self._changed()
                log.error("model %s failed to %s: %s", name, "reload" if serving else "load", reason)
                return reason
            retired = [m for v, m in entry.versions.items() if versions.get(v) is not m]
            self._files = {**{k: v for k, v in self._files.items() if k[0] != name}, **files_of}
            entry.versions, entry.state, entry.reason = versions, ModelState.READY, ""
            self._changed()
            log.info("model %s version(s) %s ready", name, ", ".join(versions))
            await self._retire(retired)
            return ""

    async def unload(self, name: str) -> None:
        """Stop serving ``name``: new requests are refused (UNAVAILABLE, "unloading") while
        everything queued on it finishes; then its versions are closed and their memory
        returned. It stays in the table as UNAVAILABLE, "unloaded"."""
        entry = self.models.get(name)
        if entry is None:
            return
        async with self._busy.setdefault(name, asyncio.Lock()):
            entry.wanted = False
            entry.state, entry.reason = ModelState.UNLOADING, ""
            self._changed()
            retired, entry.versions = list(entry.versions.values()), {}
            await self._retire(retired)
            entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"
            self._files = {k: v for k, v in self._files.items() if k[0] != name}
            self._changed()

    def forget(self, name: str) -> None:
        """Drop ``name`` from the table (after :meth:`unload`): its directory is gone, so
        requests for it are NOT_FOUND, as for any unknown model."""
        entry = self.models.get(name)
        if entry is not None and not entry.versions:
            del self.models[name]
            self._changed()

    async def _start(self, spec: ModelSpec) -> EngineModel:
        backend = await asyncio.to_thread(self.backend_factory, spec)
        try:
            served = EngineModel(spec, backend, clock=self.clock)  # type: ignore[arg-type]
        except BaseException:
            await backend.aclose()  # type: ignore[attr-defined]
            raise
        try:
            # One warm-up at a time: a model's first latency profile must not measure the
            # other models loading beside it.
            async with self._warmup:
                await served.start()
        except BaseException:
            await served.aclose()
            raise
        log.info("model %s version %s built (%s, %d slot(s))", spec.name, spec.version, spec.platform, spec.instances)
        return served

    async def _retire(self, models: list[EngineModel]) -> None:
        """Drain and close ``models`` (nothing routes to them any more), then hand the freed
        memory back to the system."""
        if not models:
            return
        await asyncio.gather(*(m.aclose() for m in models))
        del models[:]
        await asyncio.to_thread(release_memory)

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()

    def get(self, name: str, version: str = "") -> EngineModel:
        """The instance serving ``name`` at ``version`` (empty: the highest version served).

        Raises:
            ModelNotFound: no such model, or a version it does not serve.
            ModelNotReady: the model is loading, unloading, unloaded or failed to load (with the reason).
        """
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"unknown model '{name}'")
        versions = entry.versions
        if entry.state is not ModelState.READY or not versions:
            why = f": {entry.reason}" if entry.reason else ""
            raise ModelNotReady(f"model '{name}' is {entry.state.value.lower()}{why}")
        if not version:
            return next(reversed(versions.values()))
        served = versions.get(version)
        if served is None:
            raise ModelNotFound(f"model '{name}' has no version '{version}' (serving version(s) {', '.join(versions)})")
        return served

    @property
    def ready(self) -> bool:
        """Whether every model asked for (:attr:`ModelEntry.wanted`) is ready."""
        return all(e.state is ModelState.READY for e in self.models.values() if e.wanted)

    async def aclose(self) -> None:
        """Drain and unload every model: queued and running requests finish first."""
        for entry in self.models.values():
            if entry.versions:
                entry.state = ModelState.UNLOADING
        await asyncio.gather(*(m.aclose() for e in self.models.values() for m in e.versions.values()))
        for entry in self.models.values():
            entry.versions = {}
            entry.state = ModelState.UNAVAILABLE
            entry.reason = "unloaded"


def release_memory() -> None:
    """Return freed heap to the system after a model is closed: a garbage collection (the
    runtime's buffers may sit in reference cycles), then glibc's ``malloc_trim(0)``, without
    which the allocator keeps the pages of a closed ONNX Runtime session and the RSS stays
    up. Elsewhere than glibc only the collection runs."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
