"""The pytorch platform (runtimes/torch.py) on the CPU, through a real server on 127.0.0.1:
minilm_pt (a torch.export program, ``make engine``) answers what the ONNX Runtime minilm answers,
concurrent callers are batched, a TorchScript program is served with the config's tensors
(Triton's convention), and a bad model is refused with a sentence."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from helpers import SHARED_DATA

from trtserve._proto.inference import grpc_service_pb2 as pb

torch = pytest.importorskip("torch", reason="the pytorch platform needs torch (the export extra)")
# TorchScript is deprecated upstream (torch.export is its successor); Triton's models still use it.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def stsb_texts(count: int) -> np.ndarray:
    lines = (SHARED_DATA / "stsb" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1 : count + 1]
    return np.array([[line.split("\t")[1].encode()] for line in lines], dtype=object)


def test_minilm_pt_equals_the_onnx_runtime_minilm(server, engines):
    assert (engines / "minilm_pt" / "1" / "model.pt2").is_file(), "run `make engine` first"
    texts = stsb_texts(24)
    with server.client() as c:
        assert c.stub.ModelMetadata(pb.ModelMetadataRequest(name="minilm_pt")).platform == "pytorch_libtorch"
        got = c.infer("minilm_pt", {"TEXT": texts})["EMBEDDING"]
        want = c.infer("minilm", {"TEXT": texts})["EMBEDDING"]
    assert got.shape == want.shape == (24, 384) and got.dtype == np.float32
    cosine = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.9999, cosine


def test_concurrent_callers_are_batched(server):
    texts = stsb_texts(64)

    def stats(c) -> dict[int, int]:
        model = c.stub.ModelStatistics(pb.ModelStatisticsRequest(name="minilm_pt")).model_stats[0]
        return {b.batch_size: b.compute_infer.count for b in model.batch_stats}

    with server.client() as c:
        alone = c.infer("minilm_pt", {"TEXT": texts[:1]})["EMBEDDING"]
        before = stats(c)
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda i: c.infer("minilm_pt", {"TEXT": texts[i : i + 1]})["EMBEDDING"],
                                    range(64)))
        after = stats(c)
    grown = {size: n - before.get(size, 0) for size, n in after.items() if n > before.get(size, 0)}
    assert sum(size * n for size, n in grown.items()) == 64
    assert max(grown) > 1, grown  # some batch held more than one caller's row
    np.testing.assert_allclose(answers[0], alone, atol=1e-5)  # batching changes no answer


class Affine(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * scale, x.sum(dim=1, keepdim=True)


def write_scripted(root: Path, name: str, inputs: str, outputs: str, *, files: tuple[str, ...] = ("model.pt",),
                   extra: str = "") -> None:
    version = root / name / "1"
    version.mkdir(parents=True)
    for file in files:
        torch.jit.script(Affine()).save(str(version / file))
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}" backend: "pytorch" max_batch_size: 8\n'
        f"input [ {inputs} ]\noutput [ {outputs} ]\ndynamic_batching {{ }}\n{extra}"
    )


INPUTS = ('{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }, '
          '{ name: "scale" data_type: TYPE_FP32 dims: [ 1 ] }')
OUTPUTS = ('{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }, '
           '{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] }')


def test_a_torchscript_program_is_served_with_the_configs_tensors(make_server, tmp_path):
    write_scripted(tmp_path, "affine", INPUTS, OUTPUTS)
    positional = INPUTS.replace('"x"', '"INPUT__0"').replace('"scale"', '"INPUT__1"')
    write_scripted(tmp_path, "affine_positional", positional, OUTPUTS)
    srv = make_server(tmp_path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    scale = np.array([[2.0], [3.0]], dtype=np.float32)
    with srv.client() as c:
        out = c.infer("affine", {"x": x, "scale": scale})
        positional_out = c.infer("affine_positional", {"INPUT__0": x, "INPUT__1": scale})
    np.testing.assert_array_equal(out["OUTPUT__0"], x * scale)
    np.testing.assert_array_equal(out["OUTPUT__1"], x.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(positional_out["OUTPUT__0"], x * scale)


def test_bad_pytorch_models_are_unavailable_with_a_sentence(make_server, tmp_path):
    write_scripted(tmp_path, "ok", INPUTS, OUTPUTS)
    write_scripted(tmp_path, "not_an_argument", INPUTS.replace('"scale"', '"factor"'), OUTPUTS)
    write_scripted(tmp_path, "both_files", INPUTS, OUTPUTS, files=("model.pt", "model.pt2"))
    write_scripted(tmp_path, "graphs_maybe", INPUTS, OUTPUTS,
                   extra='parameters { key: "torch_cuda_graphs" value: { string_value: "maybe" } }')
    write_scripted(tmp_path, "triton_parameter", INPUTS, OUTPUTS,
                   extra='parameters { key: "INFERENCE_MODE" value: { string_value: "true" } }')
    srv = make_server(tmp_path)
    reasons = {name: entry.reason for name, entry in srv.registry.models.items()}
    assert reasons["ok"] == ""
    assert "config input 'factor' is not an argument of the program's forward('x', 'scale')" in reasons[
        "not_an_argument"]
    assert "holds both model.pt and model.pt2" in reasons["both_files"]
    assert "torch_cuda_graphs must be \"true\" or \"false\", got 'maybe'" in reasons["graphs_maybe"]
    assert "parameters ['INFERENCE_MODE'] are not ones trtserve reads" in reasons["triton_parameter"]
