"""kubeconfig files: how a client finds an `hvfleet serve` and trusts it.

`render_kubeconfig` writes the standard clientcmd shape (one cluster with the
CA embedded, one user with a bearer token, one current context) that kubectl,
client-go and the Kubernetes client libraries read as is; `load_kubeconfig`
reads the current context back for hvfleet's own API client. `local_server_ca`
finds the CA to embed when none is given: the one `hvfleet serve` made in its
data dir, when that server runs on this machine, and only if it is the CA
that signed what the server serves; otherwise the caller must name one, since
a kubeconfig kubectl cannot verify the server with is worth nothing.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import yaml

from hvfleet.model.documents import DocumentError, load_yaml
from hvfleet.model.errors import InvalidInput, Unauthorized
from hvfleet.model.token import split_token

if TYPE_CHECKING:
    import ssl  # loaded only when a CA is checked: `kubeconfig --help` must not pay

DEFAULT_NAME = "hvfleet"
_PEM_CERT = b"-----BEGIN CERTIFICATE-----"
# Where `hvfleet serve` keeps the CA it makes (hvfleet.server.tls writes
# <data dir>/tls/ca.crt): the data dir is --data-dir, else $HVFLEET_DATA_DIR,
# else ./hvfleet-data, as for serve itself.
DATA_DIR_ENV = "HVFLEET_DATA_DIR"
DEFAULT_DATA_DIR = "hvfleet-data"
# How long the check that the CA signed the running server's certificate waits.
CA_CHECK_TIMEOUT_S = 5.0
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")


@dataclass(frozen=True)
class KubeconfigTarget:
    server: str
    token: str | None
    ca_pem: bytes | None


def _check_server(server: str) -> str:
    parts = urlsplit(server)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidInput(f"server: {server!r} is not an https:// URL (e.g. https://127.0.0.1:8443)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidInput(f"server: {server!r} must be scheme://host:port only")
    return server.rstrip("/")


def check_credentials(server: str, token: str) -> None:
    """InvalidInput naming `token` or `server` when either is not one a
    kubeconfig can carry."""
    try:
        split_token(token)
    except Unauthorized:
        raise InvalidInput("token: not an hvfleet token (hvf_...)") from None
    _check_server(server)


def render_kubeconfig(
    server: str, token: str, ca_pem: bytes | None, name: str = DEFAULT_NAME
) -> dict[str, Any]:
    """A kubeconfig for `server` with `token`; `ca_pem` embedded when given (else
    the system's trusted CAs apply)."""
    check_credentials(server, token)
    if ca_pem is not None and _PEM_CERT not in ca_pem:
        raise InvalidInput("ca: not a PEM certificate")
    cluster: dict[str, Any] = {"server": _check_server(server)}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
        "preferences": {},
    }


def server_ca_path(data_dir: str | Path | None = None) -> Path:
    """The CA certificate `hvfleet serve` made in `data_dir` (default as serve's)."""
    chosen = data_dir or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return Path(chosen) / "tls" / "ca.crt"


def is_this_machine(host: str) -> bool:
    """Whether `host` names this machine: a loopback name or address, its host
    name, or an address one of its interfaces has (bindable here). No DNS."""
    import ipaddress
    import socket

    host = host.strip("[]")
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower() in {socket.gethostname().lower(), socket.getfqdn().lower()}
    if address.is_loopback:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            return False
    return True


def _hint(server: str) -> str:
    return (
        f"give the CA for {server}: the server's CA (`hvfleet serve` prints "
        "'CA certificate: PATH'; it is tls/ca.crt in its data dir), or the CA that "
        "issued its own certificate"
    )


def _signed_by(server: str, context: ssl.SSLContext, timeout: float) -> bool | None:
    """Whether the certificate `server` presents verifies against the CA `context`
    trusts, for its host name, as kubectl will check it; None when the server
    cannot be reached (not started yet), so nothing can be said."""
    import socket
    import ssl

    parts = urlsplit(server)
    host = parts.hostname or ""
    try:
        with (
            socket.create_connection((host, parts.port or 443), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except ssl.SSLCertVerificationError:
        return False
    except (OSError, ssl.SSLError):
        return None


def local_server_ca(
    server: str, data_dir: str | Path | None = None, *, timeout: float = CA_CHECK_TIMEOUT_S
) -> bytes | None:
    """The CA to embed for `server` when the caller gave none: None for plain
    HTTP (nothing to verify); the CA `hvfleet serve` made in `data_dir` when the
    server is on this machine and, if it answers, presents a certificate that
    CA signed. InvalidInput (naming `ca`, with what to pass) otherwise."""
    parts = urlsplit(_check_server(server))
    if parts.scheme == "http":
        return None
    host = parts.hostname or ""
    if not is_this_machine(host):
        raise InvalidInput(f"ca: {host} is not this machine, so its CA is not known here; " + _hint(server))
    path = server_ca_path(data_dir)
    try:
        ca_pem = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(
            f"ca: no CA of a local hvfleet serve at {path} ({exc.strerror}); name the server's "
            f"data dir, or " + _hint(server)
        ) from None
    import ssl

    try:
        if _PEM_CERT not in ca_pem:
            raise ValueError("no certificate")
        context = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    except (ValueError, ssl.SSLError):
        raise InvalidInput(f"ca: {path} is not a PEM certificate; " + _hint(server)) from None
    if _signed_by(server, context, timeout) is False:
        raise InvalidInput(
            f"ca: {server} serves a certificate the CA in {path} did not sign (another data dir, "
            "or a certificate of its own); " + _hint(server)
        )
    return ca_pem


def dump_kubeconfig(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False)


def _named(items: Any, name: str, what: str, source: str) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(what), dict):
            out: dict[str, Any] = item[what]
            return out
    raise InvalidInput(f"{source}: no {what} named {name!r}")


def load_kubeconfig(text: str, source: str = "kubeconfig", context: str | None = None) -> KubeconfigTarget:
    """The server, token and CA of `context` (default: current-context)."""
    try:
        doc = load_yaml(text)  # the one bounded YAML reader: no aliases, no deep nesting
    except DocumentError as exc:
        raise InvalidInput(f"{source}: not YAML hvfleet reads: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{source}: not a kubeconfig")
    chosen = context or doc.get("current-context")
    if not chosen:
        raise InvalidInput(f"{source}: current-context is not set")
    ctx = _named(doc.get("contexts"), chosen, "context", source)
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster")), "cluster", source)
    user = _named(doc.get("users"), str(ctx["user"]), "user", source) if ctx.get("user") else {}
    ca: bytes | None = None
    if cluster.get("certificate-authority-data"):
        try:
            ca = base64.b64decode(cluster["certificate-authority-data"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput(f"{source}: certificate-authority-data is not base64") from None
    elif cluster.get("certificate-authority"):
        try:
            with open(cluster["certificate-authority"], "rb") as f:
                ca = f.read()
        except OSError as exc:
            raise InvalidInput(f"{source}: certificate-authority: {exc.strerror}") from None
    server = cluster.get("server")
    if not isinstance(server, str):
        raise InvalidInput(f"{source}: cluster {ctx.get('cluster')!r} has no server")
    token = user.get("token")
    return KubeconfigTarget(server=server, token=token if isinstance(token, str) else None, ca_pem=ca)
