"""Configuration from the environment (issue 8): every ``trtserve serve`` option is also a
``TRTSERVE_*`` environment variable, named in ``--help``; a flag wins over its variable, and a
variable that does not parse stops the command.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest


def test_every_serve_option_is_an_environment_variable(monkeypatch, capsys):
    from trtserve.cli import build_parser

    monkeypatch.setenv("TRTSERVE_PORT", "1234")
    monkeypatch.setenv("TRTSERVE_GRACE_PERIOD", "2.5")
    monkeypatch.setenv("TRTSERVE_AUTH_HEALTH", "true")
    monkeypatch.setenv("TRTSERVE_METRICS_PORT", "9100")
    monkeypatch.setenv("TRTSERVE_LOG_FORMAT", "json")
    monkeypatch.setenv("TRTSERVE_MODEL_REPOSITORY", "/models")
    args = build_parser().parse_args(["serve"])
    assert (args.port, args.grace_period, args.auth_health, args.metrics_port) == (1234, 2.5, True, 9100)
    assert (args.log_format, args.model_repository) == ("json", Path("/models"))
    assert build_parser().parse_args(["serve", "--port", "7"]).port == 7  # the flag wins
    monkeypatch.setenv("TRTSERVE_AUTH_HEALTH", "maybe")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve"])
    monkeypatch.delenv("TRTSERVE_AUTH_HEALTH")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    flags = set(re.findall(r"(--[a-z][a-z-]+)", text)) - {"--help"}
    expected = {"--tls-cert", "--tls-key", "--tls-ca", "--auth-token-file", "--metrics-port", "--max-request-elements"}
    assert expected <= flags
    for flag in flags:
        assert f"TRTSERVE_{flag[2:].upper().replace('-', '_')}" in text.replace("\n", " ").replace("  ", ""), flag
