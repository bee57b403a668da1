"""HTTPS on the HTTP door with the gRPC door's certificate flags (``--tls-cert``, ``--tls-key``,
``--tls-ca``): ``tritonclient.http`` with ``ssl=True``, a plain ``http.client`` client and curl answer
as over plain HTTP (byte for byte the gRPC door's answer), a client that does not trust the CA
or speaks plain HTTP gets nothing, mutual TLS refuses a client without a certificate, the bearer
token is still asked for under TLS, and ``trtserve serve --allow-http true --tls-cert ...``
serves HTTPS from the command line.

In-process servers (``ServerThread``, two front ends sharing the ports) and one ``trtserve
serve`` child process; the certificates are made for the test run
(``integration/certificates.py``).
"""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th

from integration.certificates import make_certificates, write_certificates
from integration.test_http_rest import GOOD, infer_input, link_models, tiny_input
from trtserve.client import Client, Credentials
from trtserve.frontend.grpc.security import TlsConfig
from trtserve.testing import ServerProcess


@pytest.fixture(scope="module")
def pem(tmp_path_factory) -> dict[str, Path]:
    return write_certificates(make_certificates(), tmp_path_factory.mktemp("pem"))


def https(url: str, method: str, path: str, context: ssl.SSLContext, body: str | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One HTTPS request on a connection of its own: (status, body)."""
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), timeout=60, context=context)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def trusting(pem: dict[str, Path], ca: str = "ca", client: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pem[ca]))
    if client:
        context.load_cert_chain(str(pem["client_cert"]), str(pem["client_key"]))
    return context


def grpc_answer(srv, pem: dict[str, Path], x: np.ndarray, **credentials) -> bytes:
    with Client(srv.url, credentials=Credentials(root_certificates=pem["ca"].read_bytes(), **credentials)) as g:
        return g.infer("tiny", {"INPUT": x})["OUTPUT"].tobytes()


def test_https_answers_tritonclient_and_a_plain_client(make_server, engines, tmp_path, pem):
    root = link_models(engines, tmp_path / "models", "tiny")
    srv = make_server(root, http=True, tls=TlsConfig.from_files(pem["server_cert"], pem["server_key"]))
    x = tiny_input(3)
    c = th.InferenceServerClient(srv.http_url, ssl=True, ssl_options={"ca_certs": str(pem["ca"])})
    try:
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("tiny")
        assert c.get_server_metadata()["name"] == "trtserve"
        for binary in (False, True):
            out = c.infer("tiny", [infer_input("INPUT", x, "FP32", binary)]).as_numpy("OUTPUT")
            assert out.tobytes() == grpc_answer(srv, pem, x)
    finally:
        c.close()
    status, body = https(srv.http_url, "POST", "/v2/models/tiny/infer", trusting(pem), GOOD)
    assert status == 200 and json.loads(body)["outputs"][0]["name"] == "OUTPUT"
    with pytest.raises(ssl.SSLCertVerificationError):  # a CA the client does not trust
        https(srv.http_url, "GET", "/v2/health/ready", trusting(pem, "other_ca"))
    host, port = srv.http_url.rsplit(":", 1)
    plain = http.client.HTTPConnection(host, int(port), timeout=60)
    try:  # plain HTTP on the HTTPS port: no HTTP answer
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            plain.request("GET", "/v2/health/ready")
            plain.getresponse()
    finally:
        plain.close()


def test_mutual_tls_refuses_a_client_without_a_certificate_and_keeps_the_token(make_server, engines, tmp_path,
                                                                                 pem):
    root = link_models(engines, tmp_path / "models", "tiny")
    tls = TlsConfig.from_files(pem["server_cert"], pem["server_key"], pem["ca"])
    srv = make_server(root, http=True, tls=tls, auth_token="s3cret")
    token = {"Authorization": "Bearer s3cret"}
    status, body = https(srv.http_url, "POST", "/v2/models/tiny/infer", trusting(pem, client=True), GOOD, token)
    assert status == 200, body
    status, body = https(srv.http_url, "POST", "/v2/models/tiny/infer", trusting(pem, client=True), GOOD)
    assert status == 401 and "authorization" in json.loads(body)["error"]
    with pytest.raises((ssl.SSLError, ConnectionError)):  # no client certificate: the handshake fails
        https(srv.http_url, "GET", "/v2/health/live", trusting(pem))
    x = tiny_input(2)
    options = {"ca_certs": str(pem["ca"]), "certfile": str(pem["client_cert"]), "keyfile": str(pem["client_key"])}
    c = th.InferenceServerClient(srv.http_url, ssl=True, ssl_options=options)
    try:
        out = c.infer("tiny", [infer_input("INPUT", x, "FP32", True)], headers=token).as_numpy("OUTPUT")
        assert out.tobytes() == grpc_answer(srv, pem, x, token="s3cret", private_key=pem["client_key"].read_bytes(),
                                            certificate_chain=pem["client_cert"].read_bytes())
    finally:
        c.close()


def test_curl_with_the_documented_flags(make_server, engines, tmp_path, pem):
    """The HTTPS curl forms of docs/guide/http.md: ``--cacert`` (TLS); ``--cert``/``--key`` too (mutual TLS)."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed on this machine: the HTTPS curl forms cannot run (apt-get install curl)")
    root = link_models(engines, tmp_path / "models", "tiny")
    for client_ca in (None, pem["ca"]):
        srv = make_server(root, http=True, tls=TlsConfig.from_files(pem["server_cert"], pem["server_key"], client_ca))
        command = ["curl", "-s", "--cacert", str(pem["ca"]), f"https://{srv.http_url}/v2/models/tiny/infer", "-d", GOOD]
        if client_ca:
            refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
            assert refused.returncode != 0, refused.stdout  # no client certificate: no answer
            command += ["--cert", str(pem["client_cert"]), "--key", str(pem["client_key"])]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["outputs"][0]["name"] == "OUTPUT"
        srv.stop()


def test_the_http_door_takes_tls_read_from_files_only(make_server, engines, tmp_path, pem):
    root = link_models(engines, tmp_path / "models", "tiny")
    in_memory = TlsConfig(pem["server_cert"].read_bytes(), pem["server_key"].read_bytes())
    with pytest.raises(ValueError, match="TlsConfig.from_files"):
        make_server(root, http=True, tls=in_memory)


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_serve_allow_http_with_tls_flags_serves_https(engines, tmp_path, pem, frontends):
    root = link_models(engines, tmp_path / "models", "tiny")
    flags = ["--frontends", frontends, "--allow-http", "true", "--http-port", "0",
             "--tls-cert", str(pem["server_cert"]), "--tls-key", str(pem["server_key"])]
    with ServerProcess(root, *flags) as srv:
        url = srv.http_url
        x = tiny_input(2, seed=1)
        c = th.InferenceServerClient(url, ssl=True, ssl_options={"ca_certs": str(pem["ca"])})
        try:
            assert c.is_server_ready()
            out = c.infer("tiny", [infer_input("INPUT", x, "FP32", True)]).as_numpy("OUTPUT")
        finally:
            c.close()
        assert out.tobytes() == grpc_answer(srv, pem, x)
        assert srv.stop() == 0


def test_serve_with_a_key_that_is_not_pem_exits_2_naming_it(engines, tmp_path, pem):
    root = link_models(engines, tmp_path / "models", "tiny")
    (tmp_path / "bad.pem").write_text("not a key\n")
    done = subprocess.run(
        [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(root), "--port", "0",
         "--frontends", "1", "--allow-http", "true", "--http-port", "0",
         "--tls-cert", str(pem["server_cert"]), "--tls-key", str(tmp_path / "bad.pem")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert message.startswith("trtserve serve: cannot load the TLS certificate") and "bad.pem" in message, message
