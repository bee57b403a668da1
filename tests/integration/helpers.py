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

import socket
import textwrap
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from trtserve.tools.testmodels import config_text, identity, write_model

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
