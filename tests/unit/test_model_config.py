"""config.pbtxt to ModelSpec (repository.py ``load_specs``): what a valid config gives, and the
one sentence, naming the file and the field, that refuses an invalid one.

Model directories are written under ``tmp_path``. The parser only checks that a model file
exists (it picks the platform from it); it never opens it, so empty files stand in for models
here (loading them is the runtimes' business).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from trtserve.config import TimeoutAction
from trtserve.repository import ConfigError, check_repository, load_spec, load_specs, model_dirs, read_config

TENSORS = """
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def write(root: Path, name: str, config: str, versions=(1,), files=("model.onnx",)) -> Path:
    model = root / name
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(config)
    for v in versions:
        (model / str(v)).mkdir(exist_ok=True)
        for f in files:
            (model / str(v) / f).write_bytes(b"")
    return model


def refused(model: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_specs(model)
    return str(err.value)


# -- a valid config -----------------------------------------------------------------------------


def test_a_full_config_gives_the_spec_with_every_time_in_seconds(tmp_path):
    model = write(tmp_path, "full", """
        name: "full"
        max_batch_size: 16
        input [
          { name: "IDS" data_type: TYPE_INT64 dims: [ -1, 8 ] },
          { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] optional: true }
        ]
        output [ { name: "SCORE" data_type: TYPE_FP16 dims: [ 3 ] } ]
        instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_CPU } ]
        dynamic_batching {
          max_queue_delay_microseconds: 2500
          preferred_batch_size: [ 4, 8 ]
          priority_levels: 2
          default_priority_level: 2
          default_queue_policy { default_timeout_microseconds: 250000 max_queue_size: 7 }
          priority_queue_policy { key: 1 value: { timeout_action: DELAY allow_timeout_override: true } }
        }
        parameters { key: "batching" value: { string_value: "fixed" } }
        parameters { key: "priority_aging_us" value: { string_value: "500000" } }
        parameters { key: "latency_budget_us" value: { string_value: "15000" } }
        parameters { key: "split_oversized_requests" value: { string_value: "false" } }
        parameters { key: "pad_value" value: { string_value: "-1" } }
    """)
    (spec,) = load_specs(model)
    assert (spec.name, spec.version, spec.platform) == ("full", "1", "onnxruntime_onnx")  # from 1/model.onnx
    assert (spec.model_dir, spec.version_dir, spec.instances) == (model, model / "1", 3)
    assert [(t.name, t.datatype.name, t.dims, t.optional) for t in spec.inputs] == [
        ("IDS", "INT64", (-1, 8), False), ("TEXT", "BYTES", (1,), True)]
    assert [(t.name, t.datatype.name, t.dims) for t in spec.outputs] == [("SCORE", "FP16", (3,))]
    p = spec.policy
    assert (p.max_batch_size, p.max_queue_delay, p.preferred_batch_sizes) == (16, 0.0025, (4, 8))
    assert (p.priority_levels, p.default_priority, p.priority_aging, p.latency_budget) == (2, 2, 0.5, 0.015)
    assert (p.adaptive, p.split_oversized, p.pad_value, p.length_bucketing) == (False, False, -1.0, True)
    assert (p.default_queue.default_timeout, p.default_queue.max_queue_size) == (0.25, 7)
    assert p.default_queue.timeout_action is TimeoutAction.REJECT
    urgent = p.queue_policy(1)
    assert (urgent.timeout_action, urgent.allow_timeout_override, urgent.default_timeout) == (
        TimeoutAction.DELAY, True, math.inf)
    assert p.queue_policy(2) is p.default_queue
    assert spec.parameters["batching"] == "fixed" and spec.config.platform == "onnxruntime_onnx"


def test_defaults_a_minimal_config_gets(tmp_path):
    (spec,) = load_specs(write(tmp_path, "tiny", TENSORS))  # no name: the directory's
    p = spec.policy
    assert (spec.name, spec.instances, spec.batched, p.max_batch_size) == ("tiny", 1, False, 0)
    assert (p.adaptive, p.max_queue_delay, p.priority_aging, p.latency_budget, p.split_oversized) == (
        True, 0.0, 1.0, math.inf, True)
    assert (p.default_queue.default_timeout, p.default_queue.max_queue_size) == (math.inf, 0)


@pytest.mark.parametrize(("files", "declared", "platform"), [
    (("model.onnx",), "", "onnxruntime_onnx"),
    (("model.py",), "", "python"),
    (("model.plan",), "", "tensorrt_plan"),
    (("model.onnx",), 'backend: "onnxruntime"', "onnxruntime_onnx"),
    (("model.py",), 'backend: "python"', "python"),
    (("model.onnx",), 'platform: "onnxruntime_onnx"', "onnxruntime_onnx"),
])
def test_the_platform_is_the_declared_one_or_follows_the_model_file(tmp_path, files, declared, platform):
    (spec,) = load_specs(write(tmp_path, "m", declared + TENSORS, files=files))
    assert spec.platform == platform


def test_an_unknown_platform_or_no_model_file_is_refused(tmp_path):
    message = refused(write(tmp_path, "a", 'platform: "tensorflow_savedmodel"' + TENSORS))
    assert "config.pbtxt: unknown platform/backend 'tensorflow_savedmodel'" in message and "onnxruntime_onnx" in message
    message = refused(write(tmp_path, "b", TENSORS, files=()))
    assert f"config.pbtxt: no platform given and no model file in {tmp_path / 'b' / '1'}" in message


# -- refusals, each naming what -----------------------------------------------------------------


@pytest.mark.parametrize(("extra", "named"), [
    ("sequence_batching { }", "sequence_batching"),
    ("model_warmup [ { name: \"w\" batch_size: 1 } ]", "model_warmup"),
    ("dynamic_batching { preserve_ordering: true }", "dynamic_batching.preserve_ordering"),
    ("instance_group [ { count: 1 gpus: [ 0 ] } ]", "instance_group.gpus"),
])
def test_a_field_trtserve_does_not_act_on_is_refused_naming_it(tmp_path, extra, named):
    message = refused(write(tmp_path, "m", TENSORS + extra))
    assert f"trtserve does not support {named}; remove it" in message
    assert str(tmp_path / "m" / "config.pbtxt") in message


def test_every_unsupported_field_is_named_at_once(tmp_path):
    config = """
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
        sequence_batching { }
    """
    message = refused(write(tmp_path, "m", config))
    assert "does not support input.reshape, output.label_filename, sequence_batching; remove them" in message


def test_a_parameter_nobody_reads_is_refused_unless_a_handler_or_python_model_reads_it(tmp_path):
    config = TENSORS + 'parameters { key: "colour" value: { string_value: "red" } }'
    message = refused(write(tmp_path, "plain", config))
    assert "parameters ['colour'] are not ones trtserve reads" in message and "no handler.py or Python model" in message
    with_handler = write(tmp_path, "handled", config)
    (with_handler / "handler.py").write_text("")
    assert load_spec(with_handler).parameters == {"colour": "red"}
    python = write(tmp_path, "python", config, files=("model.py",))
    assert load_spec(python).parameters == {"colour": "red"}


@pytest.mark.parametrize(("parameter", "value", "words"), [
    ("latency_budget_us", "soon", "parameter latency_budget_us must be a number, got 'soon'"),
    ("batching", "eager", "parameter batching must be 'adaptive' or 'fixed', got 'eager'"),
    ("priority_aging_us", "0", "priority_aging must be > 0 seconds"),
])
def test_a_parameter_value_trtserve_cannot_use_is_refused_naming_it(tmp_path, parameter, value, words):
    config = TENSORS + f'parameters {{ key: "{parameter}" value: {{ string_value: "{value}" }} }}'
    assert words in refused(write(tmp_path, "m", config))


def test_a_name_other_than_the_directorys_is_refused(tmp_path):
    message = refused(write(tmp_path, "resnet", 'name: "resnet50"' + TENSORS))
    assert "name 'resnet50' differs from its directory 'resnet'" in message


GOOD_OUTPUT = 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]'


@pytest.mark.parametrize(("tensors", "words"), [
    ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 0 ] } ]' + GOOD_OUTPUT,
     "input 'X' dims [0]: each must be -1 or >= 1"),
    ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 4, -2 ] } ]' + GOOD_OUTPUT,
     "input 'X' dims [4, -2]: each must be -1 or >= 1"),
    ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "Y" dims: [ 1 ] } ]',
     "output 'Y' has no valid data_type (got TYPE_INVALID)"),
    (GOOD_OUTPUT, "a model needs at least one input and one output"),
])
def test_bad_tensors_are_refused_naming_the_tensor(tmp_path, tensors, words):
    assert words in refused(write(tmp_path, "m", tensors))


def test_bad_batching_values_are_refused_with_the_file(tmp_path):
    assert "max_batch_size must be >= 0, got -1" in refused(write(tmp_path, "a", "max_batch_size: -1" + TENSORS))
    preferred = "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }"
    message = refused(write(tmp_path, "b", preferred + TENSORS))
    assert str(tmp_path / "b" / "config.pbtxt") in message
    assert "preferred_batch_size 8 is outside 1..max_batch_size (4)" in message


def test_an_unparsable_config_or_a_model_without_a_version_directory_is_refused(tmp_path):
    broken = write(tmp_path, "broken", "max_batch_size: four")
    with pytest.raises(ConfigError, match="broken/config.pbtxt"):
        read_config(broken)
    assert f"{tmp_path / 'broken'}/config.pbtxt" in refused(broken)
    empty = write(tmp_path, "empty", TENSORS, versions=())
    (empty / "notes").mkdir()  # not a version: versions are numeric directories
    assert f"{empty}: no version directory" in refused(empty)


# -- version_policy -------------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "served"), [
    ("", ["3"]),  # the default: the latest one
    ("version_policy { latest { } }", ["3"]),
    ("version_policy { latest { num_versions: 2 } }", ["2", "3"]),
    ("version_policy { all { } }", ["1", "2", "3"]),
    ("version_policy { specific { versions: [ 3, 1 ] } }", ["1", "3"]),
])
def test_version_policy_picks_the_versions_served(tmp_path, policy, served):
    model = write(tmp_path, "m", TENSORS + policy, versions=(1, 2, 3))
    specs = load_specs(model)
    assert [s.version for s in specs] == served
    assert [s.version_dir for s in specs] == [model / v for v in served]
    assert load_spec(model).version == served[-1]  # the tools run the highest one


def test_a_specific_version_without_its_directory_is_refused(tmp_path):
    model = write(tmp_path, "m", TENSORS + "version_policy { specific { versions: [ 2, 5 ] } }", versions=(1, 2))
    assert "version_policy specific names versions [5] with no directory (the model has [1, 2])" in refused(model)
    model = write(tmp_path, "n", TENSORS + "version_policy { specific { } }", versions=(1,))
    assert "version_policy specific lists no versions" in refused(model)


def test_a_config_given_in_the_load_request_is_audited_the_same_way(tmp_path):
    model = write(tmp_path, "m", TENSORS)
    override = read_config(model)
    override.max_batch_size = 4
    (spec,) = load_specs(model, config=override)
    assert spec.policy.max_batch_size == 4
    override.sequence_batching.SetInParent()
    with pytest.raises(ConfigError, match=r"the load request's config\): trtserve does not support sequence_batching"):
        load_specs(model, config=override)
    assert load_spec(model).policy.max_batch_size == 0  # the file itself is unchanged


# -- the repository --------------------------------------------------------------------------------


def test_model_dirs_lists_directories_with_a_config_or_a_version(tmp_path):
    assert model_dirs(tmp_path / "missing") == [] and model_dirs(tmp_path) == []
    write(tmp_path, "b_model", TENSORS)
    (tmp_path / "a_no_config" / "1").mkdir(parents=True)  # listed, to be reported UNAVAILABLE with the reason
    (tmp_path / "c_config_only").mkdir()
    (tmp_path / "c_config_only" / "config.pbtxt").write_text(TENSORS)
    (tmp_path / "docs").mkdir()  # neither
    (tmp_path / "README.md").write_text("")
    assert model_dirs(tmp_path) == ["a_no_config", "b_model", "c_config_only"]


def test_check_repository_refuses_a_missing_or_empty_repository(tmp_path):
    with pytest.raises(ConfigError, match=re.escape(f"the model repository {tmp_path / 'missing'} is not a directory")):
        check_repository(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_repository(tmp_path / "file")
    (tmp_path / "docs").mkdir()
    with pytest.raises(ConfigError, match=re.escape(f"the model repository {tmp_path} holds no model")):
        check_repository(tmp_path)
    write(tmp_path, "m", TENSORS)
    check_repository(tmp_path)  # one model: served


# -- max_batch_size left to the server --------------------------------------------------------------


@pytest.mark.parametrize(("config", "choose", "batched", "max_batch_size"), [
    ("dynamic_batching { }", True, True, 0),                       # omitted, with a dynamic batcher
    ("max_batch_size: 0 dynamic_batching { }", True, True, 0),     # the same to protobuf
    ("", False, False, 0),                                          # no batch dimension
    ("max_batch_size: 16 dynamic_batching { }", False, True, 16),  # explicit: kept
])
def test_an_omitted_max_batch_size_with_dynamic_batching_is_left_to_the_server(tmp_path, config, choose, batched,
                                                                              max_batch_size):
    (spec,) = load_specs(write(tmp_path, "m", config + TENSORS))
    assert (spec.choose_batch_size, spec.batched, spec.policy.max_batch_size) == (choose, batched, max_batch_size)


def test_preferred_batch_sizes_need_an_explicit_max_batch_size(tmp_path):
    message = refused(write(tmp_path, "m", "dynamic_batching { preferred_batch_size: [ 8 ] }" + TENSORS))
    assert "config.pbtxt: dynamic_batching.preferred_batch_size needs an explicit max_batch_size" in message
