"""The README's first calls run verbatim: every command of the ``bash`` blocks of its "First
calls" section against a live ``trtserve serve`` started with the README's own flags
(Triton's default ports), only the ports made ephemeral (for its HTTP 8000, gRPC 8001 and
metrics 8002), and its ``python`` blocks too: ``tritonclient.grpc`` (in a process of its own, since
tritonclient registers the same protobuf symbols as trtserve) and ``openai``; beside them the
``tritonclient.http`` example of docs/guide/http.md.

Each curl command must exit 0 and print JSON that is not an error; the infer and embeddings
answers must be the 384 floats the comments promise, the gRPC call the (2, 384) its comment
promises; ``kill %1`` becomes SIGTERM and must exit 0 ("drains, exits 0"). A command of another
kind in those blocks fails the test, so that a README edit cannot add an example this test skips.
Without curl on the machine the curl blocks are skipped with a sentence (the Python blocks still
run).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trtserve.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (("README.md", "## First calls"), ("docs/guide/http.md", "## tritonclient.http"))
"""The pages and sections whose code blocks run: a section ends at the next heading of its level."""
README_ADDRESS = "127.0.0.1:8000"
README_GRPC_ADDRESS = "127.0.0.1:8001"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)


def blocks(language: str, sections: tuple[tuple[str, str], ...] = SECTIONS) -> list[str]:
    """The code blocks of ``language`` in ``sections`` (page, heading), in order."""
    found = []
    for page, heading in sections:
        text = (ROOT / page).read_text()
        start = text.index(f"\n{heading}\n")
        level = heading.split()[0]
        end = text.find(f"\n{level} ", start + len(heading) + 2)
        found += [code for lang, code in _BLOCK.findall(text[start:end if end >= 0 else None]) if lang == language]
    assert found, f"no {language} blocks under {sections}"
    return found


def python_block(module: str) -> str:
    """The one ``python`` block of :data:`SECTIONS` that imports ``module``."""
    found = [b for b in blocks("python") if re.search(rf"^import .*\b{re.escape(module)}\b", b, re.M)]
    assert len(found) == 1, f"{len(found)} python blocks import {module} under {SECTIONS}"
    return found[0]


def commands(block: str) -> list[str]:
    """The shell commands of ``block``: lines joined while a quote is open (a curl body may span
    lines), comments dropped by the shell when it runs them."""
    out, pending = [], ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if pending.strip():
            out.append(pending)
        pending = ""
    assert not pending, f"an unclosed quote in the README block:\n{block}"
    return out


def serve_flags(block: str) -> list[str]:
    """The README's ``trtserve serve`` flags, its ports made ephemeral, the repository resolved."""
    words = shlex.split(commands(block)[0], comments=True)
    assert words[0].endswith("trtserve") and words[1] == "serve" and words[-1] == "&", words
    flags = words[2:-1]
    assert "--allow-http" not in flags, f"the README's server serves HTTP by default: {flags}"
    for port in ("--port", "--http-port", "--metrics-port"):
        if port in flags:
            flags[flags.index(port) + 1] = "0"
    repository = flags.index("--model-repository")
    del flags[repository:repository + 2]
    return flags


def check_answer(words: list[str], output: str) -> None:
    """A curl command's output: JSON that is not an error; the infer and embeddings answers
    the 384 floats per text that the README's comments promise."""
    address = next(w for w in words[1:] if not w.startswith("-"))
    if "/health/" in address:  # a status check: the exit status is the answer
        return
    doc = json.loads(output)
    assert "error" not in doc, (words, doc)
    if address.endswith("/infer"):
        assert len(doc["outputs"][0]["data"]) == 384, doc
    elif address.endswith("/v1/embeddings"):
        texts = json.loads(words[words.index("-d") + 1])["input"]
        assert [len(d["embedding"]) for d in doc["data"]] == [384] * len(texts), doc
    else:
        assert doc["name"], doc  # metadata


@pytest.fixture(scope="module")
def readme_server():
    """``trtserve serve`` with the README's flags, over the README's repository (engines/)."""
    first = blocks("bash")[0]
    repository = shlex.split(commands(first)[0])[3]
    with ServerProcess(ROOT / repository, *serve_flags(first)) as srv:
        yield srv, srv.http_url


def test_the_curl_lines_run_verbatim(readme_server):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed on this machine: the README's curl lines cannot run (apt-get install curl)")
    srv, url = readme_server
    ran = 0
    for block in blocks("bash"):
        for command in commands(block):
            words = shlex.split(command, comments=True)
            if words[0].endswith("trtserve") and words[1] == "serve":
                continue  # the server this test started with the same flags
            if words == ["kill", "%1"]:
                continue  # the SIGTERM of test_sigterm_drains_and_exits_0
            assert words[0] in ("curl", "until"), f"a README command this test does not run: {command}"
            done = subprocess.run(["bash", "-c", command.replace(README_ADDRESS, url)], capture_output=True,
                                  text=True, timeout=120, cwd=ROOT)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            check_answer(words if words[0] == "curl" else words[1:], done.stdout)
            ran += 1
    assert ran >= 4  # readiness, metadata, infer, embeddings


def test_the_python_examples_run_verbatim(readme_server):
    srv, url = readme_server
    # Four: the two below, tritonclient.grpc's (test_the_grpc_example_runs_verbatim) and the queue
    # door's (tests/integration/test_queue_door.py, against a real redis-server).
    assert len(blocks("python")) == 4, "a python block no test runs"
    scope: dict = {}
    exec(compile(python_block("tritonclient.http").replace(README_ADDRESS, url), "tritonclient.http example", "exec"),
         scope)
    assert scope["out"].shape == (4, 16)  # tiny: 64 features in, 16 out
    scope = {}
    exec(compile(python_block("openai").replace(README_ADDRESS, url), "README openai example", "exec"), scope)
    assert [len(v) for v in scope["vectors"]] == [384, 384] and scope["result"].usage.prompt_tokens > 0


def test_the_grpc_example_runs_verbatim(readme_server):
    srv, _ = readme_server
    code = python_block("tritonclient.grpc").replace(README_GRPC_ADDRESS, srv.url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(2,", "384)", "float32"], done.stdout  # what the example prints


def test_sigterm_drains_and_exits_0(readme_server):
    srv, _ = readme_server
    assert srv.stop() == 0, "".join(srv.output)
