"""Certificates for the local control plane: one CA, a serving certificate for the API server,
a client certificate in `system:masters`, the real node's kubelet (`system:node:NAME` in
`system:nodes`, which the Node authorizer and NodeRestriction accept) and kube-proxy
(`system:kube-proxy`, bound to `system:node-proxier` by default), and the service-account signing key
pair."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def write_pki(directory: Path, server_ips: tuple[str, ...] = (), node: str | None = None) -> dict[str, Path]:
    """Write ca.crt/key, apiserver.crt/key (also valid for `server_ips`), admin.crt/key, sa.key/pub and,
    for a real node named `node`, node.crt/key and kube-proxy.crt/key into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=3650)

    ca_key = _key()
    ca_name = _name("speculator-operator-local-ca")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        cn: str, org: str | None, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName] | None
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = _key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    serving, serving_key = leaf(
        "kube-apiserver",
        None,
        ExtendedKeyUsageOID.SERVER_AUTH,
        [
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.96.0.1")),  # the `kubernetes` Service
            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips),
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
        ],
    )
    admin, admin_key = leaf("speculator-operator-admin", "system:masters", ExtendedKeyUsageOID.CLIENT_AUTH, None)
    clients = {}
    if node:
        clients["node"] = leaf(f"system:node:{node}", "system:nodes", ExtendedKeyUsageOID.CLIENT_AUTH, None)
        clients["kube-proxy"] = leaf("system:kube-proxy", None, ExtendedKeyUsageOID.CLIENT_AUTH, None)
    sa_key = _key()

    files = {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "ca.key": _pem_key(ca_key),
        "apiserver.crt": serving.public_bytes(serialization.Encoding.PEM),
        "apiserver.key": _pem_key(serving_key),
        "admin.crt": admin.public_bytes(serialization.Encoding.PEM),
        "admin.key": _pem_key(admin_key),
        "sa.key": _pem_key(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    for who, (cert, key) in clients.items():
        files[f"{who}.crt"] = cert.public_bytes(serialization.Encoding.PEM)
        files[f"{who}.key"] = _pem_key(key)
    paths = {}
    for name, data in files.items():
        path = directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        paths[name] = path
    return paths


def write_serving_cert(pki: Path, directory: Path, ips: tuple[str, ...], cn: str) -> tuple[Path, Path]:
    """A serving certificate for `ips`, signed by the CA in `pki` (ca.crt/ca.key), written as tls.crt/tls.key in
    `directory` (the names controller-runtime's webhook server reads): for a component on this machine that the
    API server dials by address, such as the LeaderWorkerSet webhooks."""
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    crt, pem = directory / "tls.crt", directory / "tls.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(_pem_key(key))
    pem.chmod(0o600)
    return crt, pem
