"""Export all-MiniLM-L6-v2 as a ``torch.export`` program for the pytorch platform.

The same model, tensors and numbers as engines/minilm (its ``build.py`` supplies the module:
the BERT encoder with mean pooling and L2 normalisation inside, fp32 on the CPU), exported
with ``torch.export`` and dynamic batch (1..1024) and sequence (1..256) axes:

    input_ids       INT64 [batch, sequence]
    attention_mask  INT64 [batch, sequence]   (1 = token, 0 = padding)
      -> {"EMBEDDING": FP32 [batch, 384]}

The program returns a dict, so the server reads the output's name from it; the handler is
minilm's (``handler.py`` is a link to it), which tokenizes in the front end.

Usage::

    python engines/minilm_pt/build.py [--force] [--model-dir engines/minilm_pt]

Writes ``<model_dir>/1/model.pt2`` (temp file + rename) and ``model.pt2.sha256`` (minilm's input
hash plus this file), then copies the tokenizer files beside it. A rerun with the same inputs
rewrites nothing and does not import torch. Before it is installed, the program is checked
against the eager module on real sentences, each row alone against the padded batch (1e-5).

An fp16 variant for the GPU is not built yet: the module in half precision with the pooling
kept in fp32, exported on the device (docs/guide/gpu.md).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import pathlib
import sys
import tempfile
import time
import warnings

from trtserve.files import write_atomic

PROGRAM = "model.pt2"
MAX_BATCH = 1024
ATOL = 1e-5
_MINILM_BUILD = pathlib.Path(__file__).resolve().parent.parent / "minilm" / "build.py"


def _minilm():
    """engines/minilm/build.py as a module (its model, tokenizer files, check sentences)."""
    spec = importlib.util.spec_from_file_location("trtserve_build_minilm_for_pt", _MINILM_BUILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def input_hash(minilm) -> str:
    """sha256 over minilm's export inputs and this file."""
    h = hashlib.sha256(minilm.input_hash().encode())
    h.update(pathlib.Path(__file__).read_bytes())
    return h.hexdigest()


def export(minilm, hf_dir: pathlib.Path, max_len: int):
    """The ``torch.export.ExportedProgram`` of minilm's module, returning ``{"EMBEDDING": ...}``,
    and the eager module it came from."""
    import torch
    from torch.export import Dim

    inner = minilm.sentence_embedding(hf_dir)

    class Named(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"EMBEDDING": self.inner(input_ids, attention_mask)}

    module = Named(inner).eval()
    # Batch (3) != sequence (7), with padding: no dimension confused with another.
    ids = torch.tensor([[101, 1037, 2158, 2003, 5613, 1012, 102], [101, 2093, 2273, 102, 0, 0, 0],
                        [101, 7592, 102, 0, 0, 0, 0]], dtype=torch.int64)
    batch, sequence = Dim("batch", min=1, max=MAX_BATCH), Dim("sequence", min=1, max=max_len)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' tracing notes; _verify is the check
        program = torch.export.export(module, (ids, (ids != 0).to(torch.int64)), dynamic_shapes={
            "input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}})
    return program, module


def _verify(path: pathlib.Path, module, minilm, max_len: int) -> dict:
    """Load the saved program back and compare it with the eager module; raise on a mismatch."""
    import torch

    program = torch.export.load(str(path)).module()
    ids, mask = (torch.from_numpy(a) for a in minilm._tokenize_padded(minilm._CHECK_SENTENCES, max_len))
    with torch.inference_mode():
        got = program(ids, mask)["EMBEDDING"]
        want = module(ids, mask)["EMBEDDING"]
        d_eager = float((got - want).abs().max())
        d_alone = 0.0
        for i in range(len(ids)):
            n = int(mask[i].sum())
            alone = program(ids[i:i + 1, :n], mask[i:i + 1, :n])["EMBEDDING"]
            d_alone = max(d_alone, float((alone[0] - got[i]).abs().max()))
    result = {"max_abs_program_vs_eager": d_eager, "max_abs_alone_vs_padded": d_alone}
    if got.shape != (len(ids), minilm.EMBEDDING_DIM) or got.dtype != torch.float32 or max(d_eager, d_alone) > ATOL:
        raise RuntimeError(f"exported program failed verification ({got.dtype} {list(got.shape)}): {result}")
    return result


def build(model_dir: pathlib.Path, *, force: bool = False) -> bool:
    """Export the program to ``model_dir/1/model.pt2`` and copy the tokenizer files beside it.

    Returns True when a file was written, False when everything was already up to date.

    Raises:
        RuntimeError: the model package or torch/transformers is missing and the version
            directory is incomplete (the message says what to install), or the program failed
            verification.
    """
    minilm = _minilm()
    model_dir = pathlib.Path(model_dir)
    version_dir = model_dir / "1"
    path, hash_path = version_dir / PROGRAM, version_dir / f"{PROGRAM}.sha256"
    try:
        digest = input_hash(minilm)
    except (ModuleNotFoundError, ImportError) as exc:
        return minilm.keep_without_tools("minilm_pt", version_dir, [PROGRAM, *minilm.TOKENIZER_FILES], exc,
                                         force=force)
    if not force and path.is_file() and hash_path.is_file() and hash_path.read_text().split()[0:1] == [digest]:
        return bool(minilm.copy_tokenizer(version_dir))

    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    hf_dir = minilm.package_model_dir()
    max_len = minilm.max_seq_length(hf_dir)
    program, module = export(minilm, hf_dir, max_len)
    version_dir.mkdir(parents=True, exist_ok=True)
    # torch.export.save and load want a name ending in .pt2.
    fd, tmp_name = tempfile.mkstemp(dir=version_dir, prefix=".model.", suffix=".tmp.pt2")
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    try:
        torch.export.save(program, str(tmp))
        checks = _verify(tmp, module, minilm, max_len)
        hash_path.unlink(missing_ok=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    write_atomic(hash_path, f"{digest}  {PROGRAM}\n".encode())
    minilm.copy_tokenizer(version_dir)
    print(f"minilm_pt: wrote {path} ({path.stat().st_size} bytes); checks {checks}", file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent,
                        help="model repository entry (default: this file's directory)")
    parser.add_argument("--force", action="store_true", help="export even if up to date")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    wrote = build(args.model_dir, force=args.force)
    print(f"minilm_pt: {'exported' if wrote else 'up to date (no-op)'} in {time.perf_counter() - t0:.1f}s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
