"""The model repository on disk: ``engines/<model>/config.pbtxt`` + ``<version>/model.*``
(Triton's layout), and its config parser.

:func:`load_specs` parses one model's ``config.pbtxt`` (protobuf text format) into the
project's ``inference.ModelConfig`` message and validates it into one immutable
:class:`~trtserve.spec.ModelSpec` per version served (``version_policy``). A field or
parameter trtserve does not act on is refused with a sentence naming it
(:func:`unsupported_fields`), never ignored. The engine core's live models are
:class:`~trtserve.engine.registry.ModelRegistry`'s.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from google.protobuf import text_format

from trtserve._proto.inference import model_config_pb2 as mc
from trtserve.config import BatchingPolicy, QueuePolicy, TimeoutAction
from trtserve.datatypes import BY_CONFIG_NAME
from trtserve.handlers import HANDLER_FILE
from trtserve.protocol.openai import embedding_io
from trtserve.spec import ModelSpec, TensorSpec

log = logging.getLogger(__name__)

CONFIG_FILE = "config.pbtxt"

PLATFORMS = {
    # platform or backend name in config.pbtxt → trtserve platform
    "onnxruntime_onnx": "onnxruntime_onnx",
    "onnxruntime": "onnxruntime_onnx",
    "python": "python",
    "tensorrt_plan": "tensorrt_plan",
    "tensorrt": "tensorrt_plan",
    "pytorch_libtorch": "pytorch_libtorch",
    "pytorch": "pytorch_libtorch",
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
HONOURED_CONTAINERS = frozenset({
    "input", "output", "instance_group", "dynamic_batching", "version_policy", "version_policy.latest",
    "version_policy.specific",
})
# The ``parameters`` keys trtserve itself reads (repository, dispatcher, runtimes, warm-up,
# the OpenAI door: ``openai_embeddings`` and ``matryoshka_dimensions``,
# :func:`trtserve.protocol.openai.embedding_io`).
# Any other key is for the model's own code: a handler or a Python model reads it from
# ``spec.parameters``; a model with neither would ignore it, so it is refused.
SERVER_PARAMETERS = frozenset({
    "batching", "adaptive_batch_size", "latency_budget_us", "priority_aging_us", "length_bucketing",
    "pad_value", "split_oversized_requests", "warmup_length",
    "ort_cpu_mem_arena", "ort_mem_pattern", "ort_intra_op_spinning", "isolation", "torch_cuda_graphs",
    "openai_embeddings", "matryoshka_dimensions",
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
    ``model.plan`` → tensorrt_plan, ``model.pt``/``model.pt2`` → pytorch_libtorch). A
    tensorrt_plan model whose version directory also holds ``model.onnx`` becomes
    onnxruntime_onnx on a machine without TensorRT or a CUDA device (see ``_platform``).

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
                f"{path}: version_policy specific names versions {missing} with no directory "
                f"(the model has {available})"
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
    # Triton's auto-complete fills in an omitted max_batch_size from the model and turns on the
    # dynamic batcher; here an omitted (0) max_batch_size with dynamic_batching asks the server to
    # choose it (a model that does not batch has no use for a dynamic batcher).
    choose = config.max_batch_size == 0 and config.HasField("dynamic_batching")
    if choose and config.dynamic_batching.preferred_batch_size:
        raise ConfigError(
            f"{path}: dynamic_batching.preferred_batch_size needs an explicit max_batch_size; without one "
            "(max_batch_size omitted, dynamic_batching present) the server chooses the batch size at load"
        )
    try:
        policy = _policy(config, parameters)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    instances = sum(max(g.count, 1) for g in config.instance_group) or 1
    spec = ModelSpec(
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
        choose_batch_size=choose,
    )
    try:
        embedding_io(spec)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return spec


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
        from trtserve.runtimes.tensorrt import unavailable_reason

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
    found_by_file = (("model.plan", "tensorrt_plan"), ("model.onnx", "onnxruntime_onnx"), ("model.py", "python"),
                     ("model.pt2", "pytorch_libtorch"), ("model.pt", "pytorch_libtorch"))
    for filename, platform in found_by_file:
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
    ``pad_value``, ``split_oversized_requests``. (``warmup_length`` is read by the warm-up,
    :meth:`trtserve.engine.model.EngineModel.start`.)

    Raises:
        ValueError: a parameter that is not a number, an unknown ``batching``, or a policy
            :class:`~trtserve.config.BatchingPolicy` refuses.
    """
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


__all__ = ["CONFIG_FILE", "ConfigError", "HONOURED_FIELDS", "PLATFORMS", "SERVER_PARAMETERS", "check_repository",
           "fingerprint", "load_spec", "load_specs", "model_dirs", "read_config", "served_versions",
           "unsupported_fields"]
