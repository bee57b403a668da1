"""The model repository: ``engines/<model>/config.pbtxt`` + ``<version>/model.*`` (Triton's layout).

:func:`load_spec` parses one model's ``config.pbtxt`` (protobuf text format) into the
project's ``inference.ModelConfig`` message and validates it into an immutable
:class:`~trtserve.spec.ModelSpec`. :class:`Repository` loads every model it finds; a model
whose config or file is broken is kept as *unavailable* with the reason (reported by
ModelReady, ModelMetadata and RepositoryIndex) while the other models serve.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
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
    "version_policy.latest.num_versions",
})
# Messages whose presence alone means something (``dynamic_batching { }``, ``latest { }``).
HONOURED_CONTAINERS = frozenset({"input", "output", "instance_group", "dynamic_batching", "version_policy", "version_policy.latest"})
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
    on, as dotted paths (``optimization``, ``input.reshape``, ``version_policy.all``)."""
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


def load_spec(model_dir: Path) -> ModelSpec:
    """Parse and validate ``model_dir/config.pbtxt`` and pick the version to serve.

    The served version is the highest numeric subdirectory (Triton's default "latest 1"
    version policy). The platform comes from ``platform`` or ``backend``; with neither it is
    inferred from the model file present (``model.onnx`` → onnxruntime_onnx, ``model.py`` →
    python, ``model.plan`` → tensorrt_plan). A tensorrt_plan model whose version directory
    also holds ``model.onnx`` becomes onnxruntime_onnx on a machine without TensorRT or a
    CUDA device (see ``_platform``).

    Raises:
        ConfigError: unreadable or invalid config (the message names the file and field),
            or no version directory.
    """
    path = model_dir / CONFIG_FILE
    try:
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
    except (OSError, text_format.ParseError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    name = config.name or model_dir.name
    if name != model_dir.name:
        raise ConfigError(f"{path}: name '{config.name}' differs from its directory '{model_dir.name}'")
    config.name = name
    unsupported = unsupported_fields(config)
    if config.version_policy.latest.num_versions > 1:
        unsupported.append("version_policy.latest.num_versions > 1")
    if unsupported:
        raise ConfigError(
            f"{path}: trtserve does not support {', '.join(unsupported)}; remove "
            f"{'it' if len(unsupported) == 1 else 'them'} (a field it cannot honour is refused, not ignored)"
        )
    versions = sorted((int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()))
    if not versions:
        raise ConfigError(f"{model_dir}: no version directory (e.g. {model_dir}/1/)")
    version_dir = model_dir / str(versions[-1])
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
        name=name,
        version=str(versions[-1]),
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
    """A model directory and what became of it."""

    name: str
    state: ModelState
    reason: str = ""
    spec: ModelSpec | None = None
    served: EngineModel | None = None


BackendFactory = Callable[[ModelSpec], object]


class Repository:
    """Every model under ``root``, loaded and served.

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
        self._warmup = asyncio.Lock()

    def discover(self) -> list[str]:
        """Names of the model directories (see :func:`model_dirs`), sorted."""
        return model_dirs(self.root)

    async def load_all(self) -> None:
        """Load every model found; failures are recorded, never raised."""
        for name in self.discover():
            self.models[name] = ModelEntry(name, ModelState.LOADING)
        await asyncio.gather(*(self.load(name) for name in self.models))

    async def load(self, name: str) -> ModelEntry:
        """(Re)load one model: parse its config, start its runtime, warm it up."""
        entry = self.models.setdefault(name, ModelEntry(name, ModelState.LOADING))
        entry.state = ModelState.LOADING
        try:
            spec = load_spec(self.root / name)
            entry.spec = spec
            backend = await asyncio.to_thread(self.backend_factory, spec)
            served = EngineModel(spec, backend, clock=self.clock)  # type: ignore[arg-type]
            # One warm-up at a time: a model's first latency profile must not measure the
            # other models loading beside it.
            async with self._warmup:
                await served.start()
        except Exception as exc:  # any failure leaves this model unavailable, not the server
            entry.state = ModelState.UNAVAILABLE
            entry.reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ConfigError) else str(exc)
            log.error("model %s failed to load: %s", name, entry.reason)
            return entry
        entry.served, entry.state, entry.reason = served, ModelState.READY, ""
        log.info("model %s version %s ready (%s, %d slot(s))", name, spec.version, spec.platform, spec.instances)
        return entry

    def get(self, name: str, version: str = "") -> EngineModel:
        """The serving model ``name`` (``version`` empty for the served one).

        Raises:
            ModelNotFound: no such model, or a version other than the served one.
            ModelNotReady: the model is loading, unloading or failed to load (with the reason).
        """
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"unknown model '{name}'")
        if entry.state is not ModelState.READY or entry.served is None:
            why = f": {entry.reason}" if entry.reason else ""
            raise ModelNotReady(f"model '{name}' is {entry.state.value.lower()}{why}")
        if version and version != entry.served.spec.version:
            raise ModelNotFound(
                f"model '{name}' has no version '{version}' (serving version {entry.served.spec.version})"
            )
        return entry.served

    @property
    def ready(self) -> bool:
        """Whether every model found is ready."""
        return all(e.state is ModelState.READY for e in self.models.values())

    async def aclose(self) -> None:
        """Drain and unload every model: queued and running requests finish first."""
        for entry in self.models.values():
            if entry.served is not None:
                entry.state = ModelState.UNLOADING
        await asyncio.gather(*(e.served.aclose() for e in self.models.values() if e.served is not None))
        for entry in self.models.values():
            entry.served = None
            entry.state = ModelState.UNAVAILABLE
            entry.reason = "unloaded"
