"""HTTPS for the server itself: a certificate given (``--ssl-certfile``/``--ssl-keyfile``), or
``--tls self-signed``: one made for this host's names and addresses, so that a LAN demo works in a
browser after one warning (browsers give the microphone only to HTTPS pages and localhost).

The self-signed certificate is made once, in ``<cache dir>/tls/``, and reused while it covers every
name and address the host has and is not about to expire; otherwise it is made again (a new
address after a DHCP renewal, say), which costs the visitor one more warning. It is an ECDSA
P-256 leaf certificate (serverAuth, not a CA) valid for ``SELF_SIGNED_DAYS``: what browsers
accept once told to, and what a client can trust by naming the file
(``SSL_CERT_FILE=cert.pem``, ``curl --cacert``).

Made with ``cryptography`` (pyca), which aiortc already needs for DTLS: the maintained Python
binding of OpenSSL, with an X.509 builder, so nothing shells out to ``openssl``.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from app.config import Settings
from app.http.edge import LOCALHOST_NAMES, canonical_host, machine_names_and_addresses

logger = logging.getLogger(__name__)

SELF_SIGNED_DAYS = 365
# Made again when it would expire sooner than this, so a running demo never meets an expired one.
RENEW_BEFORE_DAYS = 30
CERT_FILE = "self-signed.pem"
KEY_FILE = "self-signed.key"


@dataclass(frozen=True)
class TlsFiles:
    certfile: Path
    keyfile: Path | None


def serving_tls(settings: Settings) -> TlsFiles | None:
    """The certificate and key the server listens with; None for plain HTTP."""
    if settings.tls == "self-signed":
        names = list(dict.fromkeys([*LOCALHOST_NAMES, settings.host, *machine_names_and_addresses()]))
        names = [name for name in names if name not in ("0.0.0.0", "::", "")]
        return ensure_self_signed(settings.cache_dir / "tls", names)
    if settings.ssl_certfile is not None:
        return TlsFiles(settings.ssl_certfile, settings.ssl_keyfile)
    return None


def ensure_self_signed(directory: Path, names: list[str], *, now: datetime.datetime | None = None) -> TlsFiles:
    """The certificate in ``directory`` when it covers ``names`` and is not expiring; else a new one."""
    now = now or datetime.datetime.now(datetime.UTC)
    names = list(dict.fromkeys(canonical_host(name) for name in names))
    files = TlsFiles(directory / CERT_FILE, directory / KEY_FILE)
    assert files.keyfile is not None
    if files.certfile.is_file() and files.keyfile.is_file():
        certificate = x509.load_pem_x509_certificate(files.certfile.read_bytes())
        missing = set(names) - covered_names(certificate)
        expiring = certificate.not_valid_after_utc - now < datetime.timedelta(days=RENEW_BEFORE_DAYS)
        if not missing and not expiring:
            return files
        logger.info(
            "the self-signed certificate %s is made again: %s", files.certfile,
            f"it does not cover {sorted(missing)}" if missing else "it expires soon",
        )
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = self_signed_certificate(key, names, now=now)
    directory.mkdir(parents=True, exist_ok=True)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_private(files.keyfile, key_pem)
    _write_private(files.certfile, certificate.public_bytes(serialization.Encoding.PEM))
    logger.info("made a self-signed certificate for %s: %s", ", ".join(names), files.certfile)
    return files


def self_signed_certificate(
    key: ec.EllipticCurvePrivateKey, names: list[str], *, now: datetime.datetime
) -> x509.Certificate:
    """A leaf certificate for ``names`` (DNS names and IP addresses), signed by its own key."""
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "omni-rtc (self-signed)"),
        x509.NameAttribute(NameOID.COMMON_NAME, names[0]),
    ])
    alternative_names: list[x509.GeneralName] = []
    for name in names:
        try:
            alternative_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternative_names.append(x509.DNSName(name))
    public_key = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks of other machines lag
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(key, hashes.SHA256())
    )


def covered_names(certificate: x509.Certificate) -> set[str]:
    """The DNS names and IP addresses (as strings) a certificate names."""
    try:
        alternative = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {
        *alternative.get_values_for_type(x509.DNSName),
        *(str(address) for address in alternative.get_values_for_type(x509.IPAddress)),
    }


def _write_private(path: Path, data: bytes) -> None:
    """Writes ``data`` whole (a reader never sees half a file), readable by this user only."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
