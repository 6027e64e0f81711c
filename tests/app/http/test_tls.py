"""HTTPS in the server (``app/http/tls.py``): ``--tls self-signed`` and ``--ssl-certfile``. Served on a
real socket: tests/e2e/test_tls.py."""

from __future__ import annotations

import datetime
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509

from app.cli import main
from app.config import Settings
from app.http.tls import RENEW_BEFORE_DAYS, covered_names, ensure_self_signed, serving_tls

NAMES = ["localhost", "127.0.0.1", "::1", "gpu-box.local"]


def certificate_of(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_self_signed_covers_every_name_and_address(tmp_path):
    files = ensure_self_signed(tmp_path, NAMES)
    certificate = certificate_of(files.certfile)
    assert covered_names(certificate) == set(NAMES)
    alternative = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in alternative.get_values_for_type(x509.IPAddress)
    assert x509.ExtendedKeyUsageOID.SERVER_AUTH in certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value


def test_the_key_is_readable_by_its_owner_only(tmp_path):
    files = ensure_self_signed(tmp_path, NAMES)
    assert files.keyfile is not None
    assert stat.S_IMODE(files.keyfile.stat().st_mode) == 0o600


def test_self_signed_is_made_once_and_reused(tmp_path):
    first = ensure_self_signed(tmp_path, NAMES).certfile.read_bytes()
    again = ensure_self_signed(tmp_path, list(reversed(NAMES))).certfile.read_bytes()
    assert again == first


def test_a_new_address_makes_it_again(tmp_path):
    first = ensure_self_signed(tmp_path, NAMES).certfile.read_bytes()
    files = ensure_self_signed(tmp_path, [*NAMES, "192.168.1.20"])
    assert files.certfile.read_bytes() != first
    assert "192.168.1.20" in covered_names(certificate_of(files.certfile))


def test_one_about_to_expire_is_made_again(tmp_path):
    now = datetime.datetime.now(datetime.UTC)
    first = ensure_self_signed(tmp_path, NAMES, now=now).certfile.read_bytes()
    later = now + datetime.timedelta(days=365 - RENEW_BEFORE_DAYS + 1)
    renewed = ensure_self_signed(tmp_path, NAMES, now=later)
    assert renewed.certfile.read_bytes() != first
    assert certificate_of(renewed.certfile).not_valid_after_utc > later + datetime.timedelta(days=300)


def test_tls_self_signed_covers_this_hosts_names_and_the_bind_address(tmp_path):
    files = serving_tls(Settings(tls="self-signed", cache_dir=tmp_path, host="127.0.0.1"))
    assert files is not None
    assert files.certfile == tmp_path / "tls" / "self-signed.pem"
    assert {"localhost", "127.0.0.1"} <= covered_names(certificate_of(files.certfile))


def test_plain_http_without_tls_settings(tmp_path):
    assert serving_tls(Settings(cache_dir=tmp_path)) is None


@pytest.mark.parametrize(("argv", "named"), [
    (["--tls", "self-signed", "--ssl-certfile", "cert.pem"], "give one"),
    (["--ssl-keyfile", "key.pem"], "ssl_keyfile"),
    (["--ssl-certfile", "/nonexistent/cert.pem"], "ssl_certfile"),
])
def test_serve_refuses_tls_settings_that_cannot_work(capsys, tmp_path, argv, named):
    (tmp_path / "cert.pem").write_text("")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        assert main(["serve", *argv]) == 2
    assert named in capsys.readouterr().err
