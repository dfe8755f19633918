"""`hvfleet token`, `hvfleet kubeconfig` and serve's refusals, as a user types them."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hvfleet.model.token import split_token
from hvfleet.server.tls import ensure_serving_certificate
from hvfleet.store import open_store
from hvfleet.store.tokens import list_tokens

from .conftest import Run


def test_create_prints_the_token_once_alone_on_stdout(run: Run, db_url: str) -> None:
    created = run("token", "create", "--role", "agent", "--hypervisor", "hv1", "--ttl", "12h")
    assert created.code == 0, created.err
    text = created.out.strip()
    token_id, _ = split_token(text)
    assert created.out == text + "\n"
    assert f"token {token_id}: role agent, subject agent/hv1" in created.err
    listed = run("token", "list")
    assert listed.code == 0
    [row] = [line.split() for line in listed.out.splitlines()[1:]]
    assert row[:5] == [token_id, "agent", "agent/hv1", "hv1", "active"]
    as_json = run("token", "list", "-o", "json")
    assert text.split("_", 2)[2] not in as_json.out  # the secret is nowhere to be listed
    assert json.loads(as_json.out)["items"][0]["spec"]["secretSha256"]
    revoked = run("token", "revoke", token_id)
    assert revoked.code == 0 and "revoked" in revoked.out
    assert "revoked" in run("token", "list").out
    with open_store(db_url) as s:
        assert [t.spec.revoked for t in list_tokens(s)] == [True]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--role", "agent"), "hypervisor: an agent token is bound to one hypervisor"),
        (("--role", "viewer", "--ttl", "soon"), "error: --ttl: 'soon' is not a duration"),
        (("--role", "viewer", "--name", "agent/hv9"), "reserved for agent tokens"),
        (("--role", "viewer", "--hypervisor", "hv1"), "only an agent token is bound"),
    ],
)
def test_create_refuses_bad_input_with_exit_2(run: Run, args: tuple[str, ...], message: str) -> None:
    result = run("token", "create", *args)
    assert result.code == 2
    assert message in result.err
    assert run("token", "list").err.strip() == "No tokens found."


def test_revoking_an_unknown_token_fails(run: Run) -> None:
    result = run("token", "revoke", "0123456789abcdef")
    assert result.code == 1 and "not found" in result.err


def test_kubeconfig_embeds_the_ca_and_kubectl_reads_it(run: Run, tmp_path: Path) -> None:
    tls = ensure_serving_certificate(tmp_path / "data", "127.0.0.1")
    assert tls.ca is not None
    token = run("token", "create", "--role", "viewer").out.strip()
    out = tmp_path / "kubeconfig"
    result = run("kubeconfig", "--server", "https://127.0.0.1:8443", "--token", token,
                 "--ca", str(tls.ca), "-o", str(out))
    assert result.code == 0, result.err
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    doc = yaml.safe_load(out.read_text())
    cluster = doc["clusters"][0]["cluster"]
    assert base64.b64decode(cluster["certificate-authority-data"]) == tls.ca.read_bytes()
    # kubectl itself understands it: server, user token and CA as written.
    view = subprocess.run(
        ["kubectl", "--kubeconfig", str(out), "config", "view", "--raw", "--minify", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    seen = json.loads(view.stdout)
    assert seen["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:8443"
    assert seen["users"][0]["user"]["token"] == token
    assert seen["current-context"] == "hvfleet"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--server", "ftp://x", "--token", "hvf_0123456789abcdef_" + "a" * 43), "server:"),
        (("--server", "https://127.0.0.1:8443", "--token", "secret"), "token: not an hvfleet token"),
        (("--server", "https://127.0.0.1:8443", "--token", "hvf_0123456789abcdef_" + "a" * 43,
          "--ca", "/nonexistent/ca.crt"), "ca: /nonexistent/ca.crt: cannot read"),
    ],
)
def test_kubeconfig_refuses_bad_input(run: Run, args: tuple[str, ...], message: str) -> None:
    result = run("kubeconfig", *args)
    assert result.code == 2 and message in result.err, result


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--insecure-http", "--listen", "0.0.0.0:8080"), "plain HTTP is served only on a loopback"),
        (("--insecure-http", "--listen", "10.1.2.3:8080"), "not 10.1.2.3"),
        (("--tls-cert", "/x.crt"), "a certificate needs its key"),
        (("--listen", "8443"), "listen: '8443' is not HOST:PORT"),
        (("--listen", "::1:8443"), "brackets"),
        (("--tls-cert", "/nonexistent.crt", "--tls-key", "/nonexistent.key"), "cannot read"),
        (("--http", "h2"), "http: 'h2' is not one of auto, h11, httptools"),
        (("--loop", "trio"), "loop: 'trio' is not one of auto, asyncio, uvloop"),
    ],
)
def test_serve_refuses_unsafe_or_wrong_settings_with_exit_2(
    args: tuple[str, ...], message: str, tmp_path: Path, db_url: str
) -> None:
    # A process of its own: `hvfleet serve` becomes the server program (exec).
    result = subprocess.run(
        [str(Path(sys.executable).parent / "hvfleet"), "serve", "--data-dir", str(tmp_path / "data"),
         *args], capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was made
