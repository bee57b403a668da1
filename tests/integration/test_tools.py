"""``trtserve check`` and ``trtserve profile`` from the command line: what a user sees when the
model or the repository is wrong (one line, exit 2, no traceback; issue 17), and the verdicts of
``check`` on the shipped examples."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trtserve.cli import build_parser

SERVICE = Path(__file__).resolve().parents[2] / "service"
TOOLS = ["check", "profile"]


def run_tool(argv: list[str], capsys) -> tuple[int, str, str]:
    """``trtserve ARGV`` in this process (the parsed arguments and the tool's ``run``, as
    ``cli.main`` does, without reconfiguring this process's logging): (status, stdout, stderr)."""
    args = build_parser(argv[0]).parse_args(argv)
    code = importlib.import_module(f"trtserve.tools.{argv[0]}").run(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line(code: int, out: str, err: str, tool: str, *fragments: str) -> None:
    assert code == 2, (out, err)
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"trtserve {tool}: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def write_python(root: Path, name: str, source: str) -> Path:
    """``root/name``: a Python model FP32 INPUT0 [-1] → OUTPUT0 [-1] from ``source``."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}" backend: "python" max_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        "dynamic_batching { }\n"
    )
    return root / name


@pytest.mark.parametrize("tool", TOOLS)
def test_an_unknown_model_is_one_line_listing_the_models_there(tool, engines, capsys):
    code, out, err = run_tool([tool, "nosuch", "--model-repository", str(engines)], capsys)
    assert_one_line(code, out, err, tool, "no model 'nosuch'", str(engines), "identity_fp32", "slow")


@pytest.mark.parametrize("tool", TOOLS)
def test_a_repository_that_is_not_a_directory_is_one_line(tool, tmp_path, capsys):
    code, out, err = run_tool([tool, "identity_fp32", "--model-repository", str(tmp_path / "nowhere")], capsys)
    assert_one_line(code, out, err, tool, f"'{tmp_path / 'nowhere'}' is not a directory", "--model-repository")


@pytest.mark.parametrize("tool", TOOLS)
def test_a_repository_without_models_is_one_line(tool, tmp_path, capsys):
    (tmp_path / "identity_fp32").mkdir()  # a directory, but no config.pbtxt anywhere
    code, out, err = run_tool([tool, "identity_fp32", "--model-repository", str(tmp_path)], capsys)
    assert_one_line(code, out, err, tool, "holds no model", "config.pbtxt")


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("broken", ["config", "onnx file", "python setup"])
def test_a_model_that_cannot_load_is_one_line_with_the_reason(tool, broken, engines, tmp_path, capsys):
    if broken == "config":
        (tmp_path / "m" / "1").mkdir(parents=True)
        (tmp_path / "m" / "config.pbtxt").write_text('name: "m" max_batch_size: eight\n')
        fragments = ["config.pbtxt", "eight"]
    elif broken == "onnx file":
        (tmp_path / "m" / "1").mkdir(parents=True)
        config = (engines / "identity_fp32" / "config.pbtxt").read_text().replace('"identity_fp32"', '"m"')
        (tmp_path / "m" / "config.pbtxt").write_text(config)
        (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"not an onnx file")
        fragments = ["model.onnx"]
    else:
        write_python(tmp_path, "m", """
            class Model:
                def setup(self, config):
                    raise RuntimeError("the weights are missing")
        """)
        fragments = ["the weights are missing"]
    code, out, err = run_tool([tool, "m", "--model-repository", str(tmp_path)], capsys)
    assert_one_line(code, out, err, tool, "model 'm' cannot load: ", *fragments)


FAILS_ON_DATA = """
    import numpy as np


    class Model:
        def setup(self, config):
            pass

        def predict(self, inputs):
            x = inputs["INPUT0"]
            if np.count_nonzero(x):  # the warm-up's zeros pass; real rows do not
                raise ValueError("cannot take nonzero rows")
            return {"OUTPUT0": x}
"""

ALWAYS_FAILS_TO_RUN = """
    class Model:
        def setup(self, config):
            pass

        def predict(self, inputs):
            raise ValueError("cannot run at all")
"""


def test_check_of_a_model_failing_on_its_samples_is_one_line(tmp_path, capsys):
    write_python(tmp_path, "m", FAILS_ON_DATA)
    code, out, err = run_tool(["check", "m", "--model-repository", str(tmp_path), "--samples", "4"], capsys)
    assert_one_line(code, out, err, "check", "model 'm' failed on a sample request: ", "cannot take nonzero rows")


def test_profile_of_a_model_failing_to_run_is_one_line(tmp_path, capsys):
    write_python(tmp_path, "m", ALWAYS_FAILS_TO_RUN)
    code, out, err = run_tool(["profile", "m", "--model-repository", str(tmp_path), "--repeats", "1"], capsys)
    assert_one_line(code, out, err, "profile", "model 'm' failed on a batch of 1", "cannot run at all")


@pytest.mark.parametrize("tool", TOOLS)
def test_the_command_itself_prints_one_line_and_exits_2(tool, engines, tmp_path):
    """The installed command end to end (argument parsing, logging set-up): stderr is the one
    sentence, not a traceback, and the status is non-zero."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SERVICE), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "trtserve", tool, "nosuch", "--model-repository", str(engines)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"trtserve {tool}: no model 'nosuch'"), done.stderr


# -- verdicts ----------------------------------------------------------------------------------

REPORTS_ITS_BATCH = """
    import time

    import numpy as np


    class Model:
        def setup(self, config):
            pass

        def predict(self, inputs):
            x = inputs["INPUT0"]
            time.sleep(0.005)  # the slot stays busy a moment, so the samples queue and batch
            return {"OUTPUT0": x, "BATCH_SIZE": np.full((len(x), 1), len(x), dtype=np.int32)}
"""


@pytest.mark.parametrize("model", ["slow", "scale"])
def test_check_says_the_shipped_python_examples_are_batch_safe(model, engines, capsys):
    """``slow`` answered the size of the batch each row ran in, so ``check slow`` said NOT
    batch-safe (issue 17); the shipped examples pass."""
    code, out, err = run_tool(["check", model, "--model-repository", str(engines), "--samples", "12"], capsys)
    assert (code, err) == (0, ""), out
    assert out.splitlines()[-1] == "batch-safe"


def test_check_names_an_output_that_reports_its_batch_and_says_why_it_differs(tmp_path, capsys):
    model = write_python(tmp_path, "counts_rows", REPORTS_ITS_BATCH)
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace(
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]',
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },'
        ' { name: "BATCH_SIZE" data_type: TYPE_INT32 dims: [ 1 ] } ]',
    ))
    code, out, err = run_tool(["check", "counts_rows", "--model-repository", str(tmp_path), "--samples", "8"], capsys)
    assert (code, err) == (1, ""), out
    lines = out.splitlines()
    assert any(line.split()[:1] == ["OUTPUT0"] and line.endswith(" ok") for line in lines), out
    assert any(line.split()[:1] == ["BATCH_SIZE"] and line.endswith("DIFFERS") for line in lines), out
    assert lines[-1].startswith("NOT batch-safe: batching changes BATCH_SIZE.")
    assert "reports the batch itself" in lines[-1] and "batch_stats" in lines[-1]
