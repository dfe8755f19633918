"""The server's own CA and serving certificate, checked with a real TLS handshake."""

from __future__ import annotations

import errno
import os
import socket
import ssl
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from hvfleet.model.errors import InvalidInput
from hvfleet.server.tls import (
    SERVING_VALIDITY,
    ensure_serving_certificate,
    given_certificate,
    subject_alt_names,
)
from tests.server.tls_files import handshake


def test_a_fresh_data_dir_gets_a_ca_and_a_serving_certificate_that_verify(tmp_path: Path) -> None:
    files = ensure_serving_certificate(tmp_path, "127.0.0.1")
    assert files.ca == tmp_path / "tls" / "ca.crt"
    for key in (files.key, tmp_path / "tls" / "ca.key"):
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "tls").st_mode) == 0o700
    assert handshake(files, "127.0.0.1", "127.0.0.1") == "hello"
    assert handshake(files, "127.0.0.1", "localhost") == "hello"
    if socket.has_ipv6:
        try:
            assert handshake(files, "::1", "::1") == "hello"
        except OSError as exc:  # no IPv6 loopback configured on this machine
            assert exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT), exc
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(files, "127.0.0.1", "elsewhere.example")


def test_a_restart_reuses_both_and_a_new_host_reissues_only_the_serving_one(tmp_path: Path) -> None:
    first = ensure_serving_certificate(tmp_path, "127.0.0.1")
    assert first.ca is not None
    ca, cert = first.ca.read_bytes(), first.cert.read_bytes()
    again = ensure_serving_certificate(tmp_path, "localhost")
    assert (again.ca and again.ca.read_bytes(), again.cert.read_bytes()) == (ca, cert)
    moved = ensure_serving_certificate(tmp_path, "hv-api.example")
    assert moved.ca is not None and moved.ca.read_bytes() == ca
    assert moved.cert.read_bytes() != cert
    names = x509.load_pem_x509_certificate(moved.cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert "hv-api.example" in names.get_values_for_type(x509.DNSName)
    assert handshake(moved, "127.0.0.1", "localhost") == "hello"


def test_a_serving_certificate_near_its_end_is_renewed_by_the_same_ca(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    first = ensure_serving_certificate(tmp_path, "127.0.0.1", now=now)
    assert first.ca is not None
    ca, cert = first.ca.read_bytes(), first.cert.read_bytes()
    later = ensure_serving_certificate(tmp_path, "127.0.0.1", now=now + SERVING_VALIDITY - timedelta(days=10))
    assert later.ca is not None and later.ca.read_bytes() == ca
    assert later.cert.read_bytes() != cert


def test_a_wildcard_listen_address_names_this_machine() -> None:
    names = subject_alt_names("0.0.0.0")
    assert names[:3] == ["127.0.0.1", "::1", "localhost"]
    assert socket.gethostname() in names and "0.0.0.0" not in names
    assert subject_alt_names("[::1]") == ["127.0.0.1", "::1", "localhost"]


def test_an_operators_certificate_must_be_readable_and_match_its_key(tmp_path: Path) -> None:
    a = ensure_serving_certificate(tmp_path / "a", "127.0.0.1")
    b = ensure_serving_certificate(tmp_path / "b", "127.0.0.1")
    assert given_certificate(str(a.cert), str(a.key)).ca is None
    with pytest.raises(InvalidInput, match="does not belong"):
        given_certificate(str(a.cert), str(b.key))
    with pytest.raises(InvalidInput, match="cannot read"):
        given_certificate(str(tmp_path / "missing.crt"), str(a.key))
    with pytest.raises(InvalidInput, match="not an unencrypted PEM private key"):
        given_certificate(str(a.cert), str(a.cert))
