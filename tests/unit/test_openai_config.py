"""The ``openai_embeddings`` config parameter (repository.py ``load_specs`` with
``trtserve.protocol.openai.embedding_io``): the (input, output) a valid declaration gives, and
the sentence, naming the file and the field, that refuses an invalid one at load.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtserve.protocol.openai import dimension, embedding_io
from trtserve.repository import ConfigError, load_spec

ENGINES = Path(__file__).resolve().parents[2] / "engines"


def write(root: Path, tensors: str, value: str, max_batch_size: int = 8) -> Path:
    model = root / "embed"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"")
    (model / "config.pbtxt").write_text(f"""
        max_batch_size: {max_batch_size}
        {tensors}
        parameters {{ key: "openai_embeddings" value: {{ string_value: "{value}" }} }}
    """)
    return model


TEXT = 'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]'
EMBEDDING = 'output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 8 ] } ]'


def test_a_valid_declaration_gives_the_input_output_and_dimension(tmp_path):
    spec = load_spec(write(tmp_path, TEXT + EMBEDDING, "TEXT:EMBEDDING"))
    assert embedding_io(spec) == ("TEXT", "EMBEDDING") and dimension(spec, "EMBEDDING") == 8


def test_minilm_declares_it_and_a_model_without_the_parameter_gives_none():
    assert embedding_io(load_spec(ENGINES / "minilm")) == ("TEXT", "EMBEDDING")
    assert embedding_io(load_spec(ENGINES / "tiny")) is None


OPTIONAL = 'input [ { name: "EXTRA" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]'
REQUIRED = 'input [ { name: "EXTRA" data_type: TYPE_FP32 dims: [ 1 ] } ]'


def test_an_optional_other_input_is_allowed(tmp_path):
    assert embedding_io(load_spec(write(tmp_path, TEXT + OPTIONAL + EMBEDDING, "TEXT:EMBEDDING"))) is not None


@pytest.mark.parametrize("tensors, value, words", [
    (TEXT + EMBEDDING, "TEXT", "must be '<text input>:<embedding output>'"),
    (TEXT + EMBEDDING, ":EMBEDDING", "must be '<text input>:<embedding output>'"),
    (TEXT + EMBEDDING, "WORDS:EMBEDDING", "no input 'WORDS' (its inputs: TEXT)"),
    (TEXT + EMBEDDING, "TEXT:VECTOR", "no output 'VECTOR' (its outputs: EMBEDDING)"),
    ('input [ { name: "TEXT" data_type: TYPE_FP32 dims: [ 1 ] } ]' + EMBEDDING, "TEXT:EMBEDDING",
     "input 'TEXT' must be TYPE_STRING with dims [ 1 ]"),
    ('input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]' + EMBEDDING, "TEXT:EMBEDDING",
     "input 'TEXT' must be TYPE_STRING with dims [ 1 ]"),
    (TEXT + 'output [ { name: "EMBEDDING" data_type: TYPE_FP16 dims: [ 8 ] } ]', "TEXT:EMBEDDING",
     "output 'EMBEDDING' must be TYPE_FP32 with one fixed dim"),
    (TEXT + 'output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 2, 4 ] } ]', "TEXT:EMBEDDING",
     "output 'EMBEDDING' must be TYPE_FP32 with one fixed dim"),
    (TEXT + 'output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ -1 ] } ]', "TEXT:EMBEDDING",
     "output 'EMBEDDING' must be TYPE_FP32 with one fixed dim"),
    (TEXT + REQUIRED + EMBEDDING, "TEXT:EMBEDDING", "also requires input(s) EXTRA"),
])
def test_an_invalid_declaration_is_refused_at_load_naming_the_field(tmp_path, tensors, value, words):
    model = write(tmp_path, tensors, value)
    with pytest.raises(ConfigError) as err:
        load_spec(model)
    message = str(err.value)
    assert str(model / "config.pbtxt") in message and "parameters openai_embeddings" in message
    assert words in message, message


def test_a_model_that_does_not_batch_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="must batch"):
        load_spec(write(tmp_path, TEXT + EMBEDDING, "TEXT:EMBEDDING", max_batch_size=0))
