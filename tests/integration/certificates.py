"""Certificates made for a test run, for the TLS tests of both doors (``test_tls_and_auth.py``,
``test_http_tls.py``): a CA, a second CA nobody trusts, a server and a client certificate."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path


def make_certificates() -> dict[str, bytes]:
    """PEM by name: ``ca`` and ``other_ca`` (self-signed, EC P-256, a day long), ``server_cert``
    and ``server_key`` (signed by ``ca``, for ``localhost`` and ``127.0.0.1``), ``client_cert``
    and ``client_key`` (signed by ``ca``, client authentication)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def pem_key(key) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def cert(name, key, issuer, issuer_key, *, ca=False, usage=None, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    out: dict[str, bytes] = {}
    cas = {}
    for ca_name in ("ca", "other_ca"):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"trtserve test {ca_name}")])
        cas[ca_name] = (key, name)
        certificate = cert(f"trtserve test {ca_name}", key, name, key, ca=True)
        out[ca_name] = certificate.public_bytes(serialization.Encoding.PEM)
    ca_key, ca_name = cas["ca"]
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for who, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        out[f"{who}_key"] = pem_key(key)
        certificate = cert(who, key, ca_name, ca_key, usage=usage, san=san if who == "server" else None)
        out[f"{who}_cert"] = certificate.public_bytes(serialization.Encoding.PEM)
    return out


def write_certificates(certs: dict[str, bytes], directory: Path) -> dict[str, Path]:
    """Each PEM of :func:`make_certificates` as ``directory/<name>.pem``; the paths by name."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, pem in certs.items():
        paths[name] = directory / f"{name}.pem"
        paths[name].write_bytes(pem)
    return paths
