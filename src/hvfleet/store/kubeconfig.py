"""kubeconfig files: how a client finds an `hvfleet serve` and trusts it.

`render_kubeconfig` writes the standard clientcmd shape (one cluster with the
CA embedded, one user with a bearer token, one current context) that kubectl,
client-go and the Kubernetes client libraries read as is; `load_kubeconfig`
reads the current context back for hvfleet's own API client.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import yaml

from hvfleet.model.documents import DocumentError, load_yaml
from hvfleet.model.errors import InvalidInput, Unauthorized
from hvfleet.model.token import split_token

DEFAULT_NAME = "hvfleet"
_PEM_CERT = b"-----BEGIN CERTIFICATE-----"


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


def render_kubeconfig(
    server: str, token: str, ca_pem: bytes | None, name: str = DEFAULT_NAME
) -> dict[str, Any]:
    """A kubeconfig for `server` with `token`; `ca_pem` embedded when given (else
    the system's trusted CAs apply)."""
    try:
        split_token(token)
    except Unauthorized:
        raise InvalidInput("token: not an hvfleet token (hvf_...)") from None
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
