"""Engine runtimes, picked by a model's platform."""

from __future__ import annotations

from dataclasses import dataclass

from trtserve.errors import Unsupported
from trtserve.runtimes.base import Backend
from trtserve.spec import ModelSpec


@dataclass(frozen=True)
class RuntimeOptions:
    """Server-wide runtime settings (from the CLI).

    Attributes:
        intra_op_threads: ONNX Runtime threads per session for one operator (0: one per core).
        inter_op_threads: ONNX Runtime threads across operators (0: ORT's default).
        compute_nice: added to the nice value of ONNX Runtime's threads (0..19, 0: the
            process's; :mod:`trtserve.runtimes.threads`).
    """

    intra_op_threads: int = 0
    inter_op_threads: int = 0
    compute_nice: int = 0


def create(spec: ModelSpec, options: RuntimeOptions = RuntimeOptions()) -> Backend:
    """Build the runtime for ``spec`` (blocking: loads the model file).

    Raises:
        Unsupported: a platform this build cannot serve.
        BackendError: the model file cannot be loaded.
    """
    if spec.platform == "onnxruntime_onnx":
        from trtserve.runtimes.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(
            spec.version_dir / "model.onnx",
            slots=spec.instances,
            batched=spec.batched,
            pad_value=spec.policy.pad_value,
            intra_op_threads=options.intra_op_threads,
            inter_op_threads=options.inter_op_threads,
            cpu_mem_arena=_flag(spec, "ort_cpu_mem_arena", True),
            mem_pattern=_flag(spec, "ort_mem_pattern", True),
            spinning=_flag(spec, "ort_intra_op_spinning", False),
            nice=options.compute_nice,
        )
    if spec.platform == "python":
        from trtserve.runtimes.python import PythonBackend

        return PythonBackend(spec)
    if spec.platform == "pytorch_libtorch":
        from trtserve.runtimes.torch import TorchBackend

        return TorchBackend(
            spec.version_dir,
            config_inputs=spec.inputs,
            config_outputs=spec.outputs,
            slots=spec.instances,
            batched=spec.batched,
            pad_value=spec.policy.pad_value,
            nice=options.compute_nice,
            cuda_graphs=_flag(spec, "torch_cuda_graphs", True),
        )
    if spec.platform == "tensorrt_plan":
        # Raises GpuUnavailable (a BackendError) with one sentence where TensorRT or a CUDA
        # device is missing; repository.load_spec already picked model.onnx in that case
        # when the version directory has one.
        from trtserve.runtimes.tensorrt import TensorRTBackend
        from trtserve.runtimes.tensorrt_plan import PLAN_FILE

        return TensorRTBackend(
            spec.version_dir / PLAN_FILE,
            slots=spec.instances,
            batched=spec.batched,
            max_batch_size=spec.policy.max_batch_size,
            pad_value=spec.policy.pad_value,
        )
    raise Unsupported(f"platform '{spec.platform}' is not available in this build")


def _flag(spec: ModelSpec, key: str, default: bool) -> bool:
    """A "true"/"false" config parameter of ``spec`` (``default`` when absent).

    Raises:
        ValueError: any other value (the model then fails to load, with this reason).
    """
    value = spec.parameters.get(key)
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise ValueError(f"parameter {key} must be \"true\" or \"false\", got '{value}'")
    return value.strip().lower() == "true"
