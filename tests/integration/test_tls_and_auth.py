"""TLS, mutual TLS and bearer-token auth (issue 8): a TLS server needs a client that trusts its
CA, mutual TLS refuses a client without a certificate, every RPC needs the token (health and
reflection as configured), ``trtserve.client`` and ``trtserve bulk`` send the credentials they
are given, a token that cannot be a header is refused, incomplete TLS or auth flags stop
``trtserve serve`` with one sentence, and the token can come from the environment.

In-process servers (``ServerThread``) where a test only talks to the server; real ``trtserve
serve`` / ``trtserve bulk`` child processes for the command line. The certificates are made
for the test run (``integration/certificates.py``: an EC P-256 CA, a second CA nobody trusts, a
server and a client certificate).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from integration.certificates import make_certificates, write_certificates
from integration.helpers import row, write_identity
from servers import code_of
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.client import Client, Credentials, build_request


@pytest.fixture(scope="module")
def certs():
    return make_certificates()


def live(url: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    channel = grpc.secure_channel(url, credentials) if credentials else grpc.insecure_channel(url)
    with channel:
        return code_of(pb_grpc.GRPCInferenceServiceStub(channel).ServerLive, pb.ServerLiveRequest(), timeout=5)


def test_tls_server_needs_a_client_that_trusts_its_ca(make_server, tmp_path, certs):
    from trtserve.frontend.grpc.security import TlsConfig

    write_identity(tmp_path)
    srv = make_server(tmp_path, tls=TlsConfig(certs["server_cert"], certs["server_key"]))
    assert live(srv.url, grpc.ssl_channel_credentials(root_certificates=certs["ca"])) == grpc.StatusCode.OK
    untrusted = grpc.ssl_channel_credentials(root_certificates=certs["other_ca"])
    assert live(srv.url, untrusted) == grpc.StatusCode.UNAVAILABLE
    assert live(srv.url, None) == grpc.StatusCode.UNAVAILABLE  # plaintext against TLS


def test_mutual_tls_refuses_a_client_without_a_certificate(make_server, tmp_path, certs):
    from trtserve.frontend.grpc.security import TlsConfig

    write_identity(tmp_path)
    srv = make_server(tmp_path, tls=TlsConfig(certs["server_cert"], certs["server_key"], client_ca=certs["ca"]))
    with_cert = grpc.ssl_channel_credentials(
        certs["ca"], private_key=certs["client_key"], certificate_chain=certs["client_cert"]
    )
    assert live(srv.url, with_cert) == grpc.StatusCode.OK
    assert live(srv.url, grpc.ssl_channel_credentials(root_certificates=certs["ca"])) == grpc.StatusCode.UNAVAILABLE
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    # trtserve.client over mutual TLS: values back exact, streams too.
    mutual = Credentials(
        root_certificates=certs["ca"], private_key=certs["client_key"], certificate_chain=certs["client_cert"]
    )
    with Client(srv.url, credentials=mutual) as c:
        assert c.infer("ident", {"INPUT0": x}, timeout=10)["OUTPUT0"].tolist() == x.tolist()
        assert [out["OUTPUT0"].tolist() for _, out in c.stream_infer("ident", [{"INPUT0": x}])] == [x.tolist()]
    with Client(srv.url, credentials=Credentials(root_certificates=certs["ca"])) as c:  # no client certificate
        assert code_of(c.infer, "ident", {"INPUT0": x}, timeout=10) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("protect_health", [False, True])
def test_bearer_token_is_required_health_and_reflection_configurable(make_server, tmp_path, protect_health):
    write_identity(tmp_path)
    srv = make_server(tmp_path, auth_token="s3cret", auth_health=protect_health)
    good = [("authorization", "Bearer s3cret")]
    with grpc.insecure_channel(srv.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = build_request("ident", row(3))
        assert code_of(stub.ModelInfer, request) == grpc.StatusCode.UNAUTHENTICATED
        for bad in ("Bearer wrong", "s3cret"):  # a wrong token; the right one without its scheme
            metadata = [("authorization", bad)]
            assert code_of(stub.ModelInfer, request, metadata=metadata) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(stub.ModelInfer, request, metadata=good) == grpc.StatusCode.OK
        assert code_of(stub.ServerReady, pb.ServerReadyRequest()) == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            list(stub.ModelStreamInfer(iter([request])))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert len(list(stub.ModelStreamInfer(iter([request]), metadata=good))) == 1
        check = health_pb2_grpc.HealthStub(channel).Check
        expected = grpc.StatusCode.UNAUTHENTICATED if protect_health else grpc.StatusCode.OK
        assert code_of(check, health_pb2.HealthCheckRequest()) == expected
        assert code_of(check, health_pb2.HealthCheckRequest(), metadata=good) == grpc.StatusCode.OK
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        reflect = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo
        list_services = reflection_pb2.ServerReflectionRequest(list_services="")
        assert code_of(lambda: list(reflect(iter([list_services])))) == expected
    # trtserve.client sends the token on every call when given one.
    with Client(srv.url, credentials=Credentials(token="s3cret")) as c:
        assert c.is_ready() and c.is_ready("ident")
        assert c.infer("ident", row(3), timeout=10)["OUTPUT0"].shape == (1, 3)
        assert len(list(c.stream_infer("ident", [row(2), row(3)]))) == 2
    with Client(srv.url, credentials=Credentials(token="wrong")) as c:
        assert code_of(c.infer, "ident", row(3), timeout=10) == grpc.StatusCode.UNAUTHENTICATED


def test_bulk_job_over_mutual_tls_with_a_token(make_server, tmp_path, certs):
    """``trtserve bulk --tls-ca --tls-cert --tls-key --auth-token-file`` against a server that
    requires all of them: every row comes back exact."""
    import pyarrow.parquet as pq

    from trtserve.frontend.grpc.security import TlsConfig

    write_identity(tmp_path / "repo")
    tls = TlsConfig(certs["server_cert"], certs["server_key"], client_ca=certs["ca"])
    srv = make_server(tmp_path / "repo", tls=tls, auth_token="s3cret")
    files = write_certificates(certs, tmp_path / "pem")
    (tmp_path / "token").write_text("s3cret\n")
    rows = [{"id": f"r{i}", "x": [float(i), i + 0.5, -i, 2.0 * i]} for i in range(40)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = [sys.executable, "-m", "trtserve", "bulk", "--input", tmp_path / "in.jsonl", "--model", "ident",
               "--input-column", "INPUT0=x", "--endpoint", srv.url, "--output", tmp_path / "out.parquet",
               "--tls-ca", files["ca"], "--tls-cert", files["client_cert"], "--tls-key", files["client_key"],
               "--auth-token-file", tmp_path / "token", "--no-progress"]
    done = subprocess.run([str(a) for a in command], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    table = pq.read_table(tmp_path / "out.parquet").to_pydict()
    got = dict(zip(table["id"], table["OUTPUT0"]))
    assert got == {r["id"]: pytest.approx(r["x"]) for r in rows}
    half = [str(a) for a in command if str(a) != str(files["client_key"]) and a != "--tls-key"]
    refused = subprocess.run(half, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--tls-cert and --tls-key go together" in refused.stderr
    # A wrong token stops the job at once (retrying cannot help), naming the status.
    (tmp_path / "wrong").write_text("nope\nsecond line\n")  # only the first line is the token
    wrong = [str(a) if a != tmp_path / "token" else str(tmp_path / "wrong") for a in command]
    t0 = time.monotonic()
    stopped = subprocess.run(wrong + ["--output", str(tmp_path / "other.parquet")],
                             capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 1 and "UNAUTHENTICATED" in stopped.stderr, stopped.stderr
    assert time.monotonic() - t0 < 60  # not the 300 s stall timeout
    (tmp_path / "empty").write_text("")
    empty = [str(a) if a != tmp_path / "token" else str(tmp_path / "empty") for a in command]
    refused = subprocess.run(empty, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "is empty" in refused.stderr


def test_credentials_refuse_a_token_that_cannot_be_a_header(tmp_path):
    for bad in ("", "two words", "line\nbreak", "caf\u00e9"):
        with pytest.raises(ValueError, match="printable ASCII"):
            Credentials(token=bad)
    (tmp_path / "t").write_text("  s3cret  \nignored\n")
    assert Credentials.from_files(token_file=tmp_path / "t").token == "s3cret"


def test_serve_refuses_incomplete_tls_or_auth_flags_with_one_sentence(tmp_path):
    write_identity(tmp_path)
    cases = [
        (["--tls-cert", str(tmp_path / "c.pem")], "--tls-cert and --tls-key go together"),
        (["--auth-token-file", str(tmp_path / "missing")], "cannot read --auth-token-file"),
        (["--auth-health"], "--auth-health needs a token"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "TRTSERVE_AUTH_TOKEN"}
    for extra, message in cases:
        done = subprocess.run(
            [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(tmp_path), "--port", "0", *extra],
            capture_output=True, text=True, timeout=60, env=env,
        )
        assert done.returncode == 2 and message in done.stderr, (extra, done.stderr)
        assert "Traceback" not in done.stderr


def test_token_from_the_environment(tmp_path):
    write_identity(tmp_path)
    env = {**os.environ, "TRTSERVE_AUTH_TOKEN": "from-env"}
    env.pop("TRTSERVE_AUTH_TOKEN_FILE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(tmp_path),
         "--host", "127.0.0.1", "--port", "0", "--http-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:
            if m := re.search(r"listening on ([\d.]+:\d+)", line):
                url = m.group(1)
                break
        assert url
        with grpc.insecure_channel(url) as channel:
            ready = pb_grpc.GRPCInferenceServiceStub(channel).ServerReady
            assert code_of(ready, pb.ServerReadyRequest()) == grpc.StatusCode.UNAUTHENTICATED
            assert ready(pb.ServerReadyRequest(), metadata=[("authorization", "Bearer from-env")]).ready
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
