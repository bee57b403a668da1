"""Models and probes shared by the integration tests of operating trtserve (issue 8): metrics,
health, graceful drain, TLS and auth, per-request caps (``test_metrics.py``, ``test_health.py``,
``test_graceful_drain.py``, ``test_tls_and_auth.py``, ``test_request_caps.py``), load shedding
(``test_shedding.py``) and ``trtserve bulk`` (``test_bulk.py``).

* :func:`write_slow`: a Python model with a known run time (``batch_ms`` per batch, ``row_ms`` per
  row, ``late_s`` more for a request whose first value is 7, ``setup_s`` to load);
* :func:`write_identity`: an FP32 ONNX Runtime identity with dims [-1];
* :func:`scrape` and :func:`sample`: a Prometheus endpoint's samples, and one of them by labels;
* :func:`free_port`: a TCP port on 127.0.0.1 nothing listens on (yet).
"""

from __future__ import annotations

import os
import socket
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from trtserve.testing.models import config_text, identity, write_model

SHARED_DATA = Path(os.environ.get("TRTSERVE_DATA") or Path(__file__).resolve().parents[2].parent / "shared" / "data")
"""The shared data directory (stsb/, corpus/): ``TRTSERVE_DATA`` (``make test DATA=...`` sets it), else
``../shared/data`` beside the repository."""

# A Python model with a known run time: batch_ms per batch (+ row_ms per row); a request whose
# first value is 7 takes late_s more (to overrun its deadline); setup sleeps setup_s (load time).
SLOW = """
    import time


    class Model:
        def setup(self, config):
            p = config.parameters
            self.batch_s = float(p.get("batch_ms", 20)) / 1000
            self.row_s = float(p.get("row_ms", 0)) / 1000
            self.late_s = float(p.get("late_s", 0))
            time.sleep(float(p.get("setup_s", 0)))

        def predict(self, inputs):
            x = inputs["INPUT0"]
            time.sleep(self.batch_s + self.row_s * len(x))
            if (x[:, 0] == 7).any():
                time.sleep(self.late_s)
            return {"OUTPUT0": x}
"""


def write_slow(root: Path, name: str = "slow", *, max_batch_size: int = 8, queue: str = "", **params: float) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(SLOW))
    parameters = "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    (root / name / "config.pbtxt").write_text(
        f"""
        name: "{name}" backend: "python" max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        dynamic_batching {{ {queue} }}
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        {parameters}
        """
    )


def write_identity(root: Path, name: str = "ident", extra: str = "dynamic_batching { }") -> None:
    config = config_text(name, [("INPUT0", "FP32", (-1,))], [("OUTPUT0", "FP32", (-1,))], extra=extra)
    write_model(root, name, identity("FP32", (-1,)), config)


def row(n: int, value: float = 1.0) -> dict[str, np.ndarray]:
    return {"INPUT0": np.full((1, n), value, np.float32)}


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_file(path: Path, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path} did not appear in {timeout} s"
        time.sleep(0.01)


# A Python model that holds a request whose first value is 7 until a file exists (so a test
# can drain or signal while it is admitted, without guessing times); anything else is echoed at once.
GATE = """
    import os
    import time


    class Model:
        def setup(self, config):
            self.started = config.parameters["started"]
            self.release = config.parameters["release"]

        def predict(self, inputs):
            x = inputs["INPUT0"]
            if (x[:, 0] == 7).any():
                open(self.started, "w").close()
                end = time.monotonic() + 120  # a safety valve only: the test releases it
                while not os.path.exists(self.release) and time.monotonic() < end:
                    time.sleep(0.01)
            return {"OUTPUT0": x}
"""


def write_gate(root: Path, name: str = "gate") -> tuple[Path, Path]:
    """The gate model in ``root``; returns (the file it makes when a held request starts,
    the file that releases it)."""
    started, release = root.parent / f"{name}.started", root.parent / f"{name}.release"
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(GATE))
    (root / name / "config.pbtxt").write_text(textwrap.dedent(f"""
        name: "{name}" backend: "python" max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        parameters {{ key: "started" value: {{ string_value: "{started}" }} }}
        parameters {{ key: "release" value: {{ string_value: "{release}" }} }}
    """))
    return started, release


def word_pieces(engines: Path):
    """minilm's tokenizer (``tokenizers.Tokenizer``) with neither truncation nor padding: a text's
    whole token sequence, as the long-text and tokenize tests compare against."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(engines / "minilm" / "1" / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok
