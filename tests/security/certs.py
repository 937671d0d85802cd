"""Certificates the TLS tests make for themselves: a CA, and leaf certificates it signs for 127.0.0.1.

Every service of a test fleet serves with one leaf and presents the same one when it dials its peers, as
a pod would with one certificate per workload; the leaf is valid for both server and client use.
Elliptic-curve keys keep generation fast.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=1)
CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


@dataclasses.dataclass(frozen=True)
class Leaf:
    """PEM files of a certificate chain and its private key, and the CA bundle to verify peers with."""

    cert: Path
    key: Path
    ca: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()


class Authority:
    """A self-signed CA that writes its certificate and the leaves it signs into `folder`."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(CA_KEY_USAGE, critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca = self._write(f"{name}-ca.pem", self._cert.public_bytes(serialization.Encoding.PEM))

    def _write(self, filename: str, data: bytes) -> Path:
        path = self.folder / filename
        path.write_bytes(data)
        return path

    def issue(self, common_name: str) -> Leaf:
        """A leaf for 127.0.0.1 and localhost, usable to serve and to dial."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return Leaf(
            cert=self._write(f"{self.name}-{common_name}.pem", cert.public_bytes(serialization.Encoding.PEM)),
            key=self._write(f"{self.name}-{common_name}.key", key_pem),
            ca=self.ca,
        )
