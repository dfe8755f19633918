"""The server's own TLS: a private CA and a serving certificate in the data dir.

When `hvfleet serve` is given no certificate, it creates (once) a CA and a
serving certificate signed by it under `<data dir>/tls/`, and reuses them on
every restart, so the CA a kubeconfig embeds stays valid. The serving
certificate is re-issued by the same CA when it no longer names every address
the server answers on, or is about to expire. Keys are ECDSA P-256, written
owner-only (0600) before any byte of them is, and never logged.

Replicas over one store share one CA (`shared_signer`): it is kept in the store
as a server secret (Store.server_secret: no kind, no API role reads it), made
by the first replica that starts (from its data dir's CA when it has one, so
kubeconfigs made for it stay valid), and each replica issues its own serving
certificate from it for the names it is given. Its data dir then holds the
CAs clients should trust (`ca.crt`, a bundle while a rotation runs) and its
own serving key, never the CA's key. `rotate_shared_ca` moves a rotation on
one step (docs/scaling.md: begin, switch, end, each followed by a rolling
restart of the replicas).
"""

from __future__ import annotations

import base64
import fcntl
import ipaddress
import json
import os
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hvfleet.model.errors import InvalidInput
from hvfleet.store.base import Store

CA_VALIDITY = timedelta(days=3650)
SERVING_VALIDITY = timedelta(days=365)
# Re-issue the serving certificate on a restart this close to its end.
RENEW_BEFORE = timedelta(days=30)
ALWAYS_NAMED = ("127.0.0.1", "::1", "localhost")
_WILDCARD_HOSTS = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class ServingFiles:
    cert: Path
    key: Path
    ca: Path | None  # None when the operator brought the certificate


def subject_alt_names(listen_host: str, extra: Iterable[str] = ()) -> list[str]:
    """Names the serving certificate must carry: loopback, the listen host, and
    for a wildcard listen address this machine's host names (clients cannot
    connect to 0.0.0.0)."""
    names: list[str] = list(ALWAYS_NAMED)
    hosts = [listen_host.strip("[]"), *extra]
    if listen_host.strip("[]") in _WILDCARD_HOSTS:
        hosts += [socket.gethostname(), socket.getfqdn()]
    for host in hosts:
        if host and host not in _WILDCARD_HOSTS and host not in names:
            names.append(host)
    return names


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _names_in(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in san.get_values_for_type(x509.IPAddress)} | set(
        san.get_values_for_type(x509.DNSName)
    )


def _write_private(path: Path, data: bytes) -> None:
    """Write owner-only, atomically: the key is never readable by others, and a
    crash never leaves half a file where a key should be."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask cannot loosen it; an old file is replaced
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    # Two servers started together on one data dir must not make two CAs.
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _make_ca(now: datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "hvfleet"),
        x509.NameAttribute(NameOID.COMMON_NAME, f"hvfleet CA {socket.gethostname()}"),
    ])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_serving(
    ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, names: list[str], now: datetime
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(min(now + SERVING_VALIDITY, ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_encipherment=False, key_cert_sign=False, crl_sign=False,
                content_commitment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _load_ca(
    cert_path: Path, key_path: Path, now: datetime
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    if not (cert_path.exists() and key_path.exists()):
        return None
    ca = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or ca.not_valid_after_utc <= now + RENEW_BEFORE:
        return None
    return key, ca


def _serving_is_good(
    cert_path: Path, key_path: Path, ca: x509.Certificate, names: list[str], now: datetime
) -> bool:
    if not (cert_path.exists() and key_path.exists()):
        return False
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    return (
        key.public_key() == cert.public_key()
        and cert.not_valid_after_utc > now + RENEW_BEFORE
        and set(names) <= _names_in(cert)
    )


@dataclass(frozen=True)
class Signer:
    """The CA that issues serving certificates, and every CA clients should
    trust meanwhile (PEM, the signer's own first)."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    trust: bytes


def ensure_serving_certificate(
    data_dir: Path, listen_host: str, *, extra_names: Iterable[str] = (), now: datetime | None = None,
    shared: Signer | None = None,
) -> ServingFiles:
    """The CA and serving certificate under `data_dir/tls`, made or renewed as
    needed; with `shared`, the serving certificate is issued by that CA and
    `ca.crt` is its trust bundle (no CA key is written here)."""
    now = now or datetime.now(UTC)
    directory = data_dir / "tls"
    try:
        # Owner-only from the start: it holds the CA's key.
        data_dir.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass  # an operator's own directory keeps its mode
    else:
        os.chmod(data_dir, 0o700)  # whatever the umask
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca_cert, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key = directory / "server.crt", directory / "server.key"
    names = subject_alt_names(listen_host, extra_names)
    with _locked(directory):
        if shared is not None:
            signer, ca = shared.key, shared.cert
            if not ca_cert.exists() or ca_cert.read_bytes() != shared.trust:
                _write_public(ca_cert, shared.trust)
        else:
            loaded = _load_ca(ca_cert, ca_key, now)
            if loaded is None:
                signer, ca = _make_ca(now)
                _write_private(ca_key, _key_pem(signer))
                _write_public(ca_cert, ca.public_bytes(serialization.Encoding.PEM))
            else:
                signer, ca = loaded
        if not _serving_is_good(cert, key, ca, names, now):
            serving_key, serving = _make_serving(signer, ca, names, now)
            _write_private(key, _key_pem(serving_key))
            _write_public(cert, serving.public_bytes(serialization.Encoding.PEM))
    return ServingFiles(cert=cert, key=key, ca=ca_cert)


# -- one CA for every replica over one store -----------------------------------------

SHARED_CA = "serving-ca"
ROTATION_STEPS = ("begin", "switch", "end")


@dataclass(frozen=True)
class _SharedCa:
    """As kept in the store: the signing CA, the one a rotation moves to, and
    every CA certificate clients are to trust (the signer's first)."""

    cert: bytes
    key: bytes
    trust: tuple[bytes, ...]
    next_cert: bytes | None = None
    next_key: bytes | None = None

    def encode(self) -> bytes:
        def text(b: bytes | None) -> str | None:
            return None if b is None else base64.b64encode(b).decode()
        return json.dumps({"cert": text(self.cert), "key": text(self.key),
                           "trust": [text(t) for t in self.trust],
                           "next_cert": text(self.next_cert), "next_key": text(self.next_key)}).encode()

    @staticmethod
    def decode(raw: bytes) -> _SharedCa:
        doc = json.loads(raw)

        def data(v: str | None) -> bytes | None:
            return None if v is None else base64.b64decode(v)
        cert, key = data(doc["cert"]), data(doc["key"])
        assert cert is not None and key is not None
        return _SharedCa(cert, key, tuple(base64.b64decode(t) for t in doc["trust"]),
                         data(doc.get("next_cert")), data(doc.get("next_key")))

    def signer(self) -> Signer:
        key = serialization.load_pem_private_key(self.key, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise InvalidInput("the shared serving CA in the store has a key of an unknown type")
        return Signer(key, x509.load_pem_x509_certificate(self.cert), b"".join(self.trust))


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _new_shared(seed: tuple[ec.EllipticCurvePrivateKey, x509.Certificate]) -> _SharedCa:
    key, cert = seed
    return _SharedCa(_pem(cert), _key_pem(key), (_pem(cert),))


def shared_signer(store: Store, data_dir: Path, now: datetime | None = None) -> Signer | None:
    """The CA every replica over `store` signs with, made by the first one to
    ask (seeded from its data dir's own CA when it has one); None when the
    store keeps no server secrets (a remote store): the data dir's CA then."""
    now = now or datetime.now(UTC)
    try:
        found = store.server_secret(SHARED_CA)
    except NotImplementedError:
        return None
    while found is None:
        directory = data_dir / "tls"
        seed = _load_ca(directory / "ca.crt", directory / "ca.key", now) or _make_ca(now)
        store.put_server_secret(SHARED_CA, _new_shared(seed).encode(), None)
        found = store.server_secret(SHARED_CA)  # ours, or the replica's that came first
    return _SharedCa.decode(found[0]).signer()


def rotate_shared_ca(store: Store, step: str, now: datetime | None = None) -> str:
    """Move a rotation of the shared CA one step on; what was done, in one line.

    begin: a new CA is made and trusted beside the current one (kubeconfigs
    made from now on trust both); switch: the new CA signs (each replica
    issues its serving certificate from it when restarted), the old one is
    still trusted; end: only the new one is trusted."""
    now = now or datetime.now(UTC)
    if step not in ROTATION_STEPS:
        raise InvalidInput(f"rotate-ca: {step!r} is not one of {', '.join(ROTATION_STEPS)}")
    for _ in range(10):
        found = store.server_secret(SHARED_CA)
        if found is None:
            raise InvalidInput("rotate-ca: the store holds no shared CA yet (start a replica first)")
        ca, version = _SharedCa.decode(found[0]), found[1]
        if step == "begin":
            if ca.next_cert is not None:
                raise InvalidInput("rotate-ca: a rotation has begun already; switch next")
            key, cert = _make_ca(now)
            new = replace(ca, next_cert=_pem(cert), next_key=_key_pem(key),
                          trust=(*ca.trust, _pem(cert)))
            said = ("a new CA is trusted beside the current one; restart each replica (each then "
                    "serves the new trust bundle), hand out kubeconfigs again, then switch")
        elif step == "switch":
            if ca.next_cert is None or ca.next_key is None:
                raise InvalidInput("rotate-ca: no rotation has begun (begin first)")
            old = [t for t in ca.trust if t != ca.next_cert]
            new = _SharedCa(ca.next_cert, ca.next_key, (ca.next_cert, *old))
            said = "the new CA signs now; restart each replica, then end"
        else:
            if ca.next_cert is not None:
                raise InvalidInput("rotate-ca: the rotation has not switched yet (switch first)")
            new = replace(ca, trust=(ca.cert,))
            said = "only the current CA is trusted now; hand out kubeconfigs again"
        if store.put_server_secret(SHARED_CA, new.encode(), version):
            return said
    raise InvalidInput("rotate-ca: the shared CA kept changing under this rotation; try again")


def given_certificate(cert: str, key: str) -> ServingFiles:
    """An operator's certificate and key, checked to be readable and a pair, so a
    typo is one clear line instead of a TLS stack trace at start-up."""
    cert_path, key_path = Path(cert), Path(key)
    try:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except OSError as exc:
        raise InvalidInput(f"TLS certificate {cert}: cannot read: {exc.strerror}") from None
    except ValueError:
        raise InvalidInput(f"TLS certificate {cert}: not a PEM certificate") from None
    try:
        private = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        raise InvalidInput(f"TLS key {key}: cannot read: {exc.strerror}") from None
    except (ValueError, TypeError):
        raise InvalidInput(f"TLS key {key}: not an unencrypted PEM private key") from None
    if private.public_key() != certificate.public_key():
        raise InvalidInput(f"TLS key {key} does not belong to certificate {cert}")
    return ServingFiles(cert=cert_path, key=key_path, ca=None)
