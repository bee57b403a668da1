"""``slow``: identity that takes a known time, batch_ms + row_ms * rows per batch.

Config parameters ``batch_ms`` (default 20) and ``row_ms`` (default 1), in milliseconds.
Output: OUTPUT0 = INPUT0 (FP32 [rows, n]). Nothing in an answer depends on the batch it ran in
(``trtserve check slow`` passes); ModelStatistics' ``batch_stats`` say which batch sizes ran.

``executed`` counts the rows this instance has run (the warm-up row included). The server
runs thread isolation here, so an in-process test reads it as
``server.repository.get("slow").backend.models[0].executed``.
"""

from __future__ import annotations

import time

import numpy as np


class Model:
    def setup(self, config) -> None:
        self.batch_s = float(config.parameters.get("batch_ms", 20)) / 1000
        self.row_s = float(config.parameters.get("row_ms", 1)) / 1000
        self.executed = 0

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["INPUT0"]
        rows = len(x)
        time.sleep(self.batch_s + self.row_s * rows)
        self.executed += rows
        return {"OUTPUT0": x}
