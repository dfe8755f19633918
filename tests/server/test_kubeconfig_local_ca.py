"""`hvfleet kubeconfig` without `--ca` (issue 16 §5): it embeds the CA of the
`hvfleet serve` on this machine, which real kubectl then verifies the real
server with; it refuses (exit 2, with what to pass) when that CA is not here,
did not sign what the running server serves, or the server is elsewhere."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from hvfleet.server.tls import ensure_serving_certificate
from hvfleet.store.kubeconfig import is_this_machine
from tests.support.kubectl import KUBECTLS
from tests.support.serve import HVFLEET, Server


def kubeconfig(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
               ) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "HVFLEET_DATA_DIR"}
    return subprocess.run([HVFLEET, "kubeconfig", *args], capture_output=True, text=True, timeout=60,
                          env={**environ, **(env or {})}, cwd=cwd)


def embedded_ca(config: Path) -> bytes:
    cluster = yaml.safe_load(config.read_text())["clusters"][0]["cluster"]
    return base64.b64decode(cluster["certificate-authority-data"])


@pytest.mark.parametrize("version", sorted(KUBECTLS))
def test_without_ca_the_local_servers_ca_is_embedded_and_kubectl_verifies_with_it(
    server: Server, tmp_path: Path, version: str
) -> None:
    config = tmp_path / "viewer.yaml"
    made = kubeconfig("--server", server.url, "--token", server.tokens["viewer"], "-o", str(config),
                      env={"HVFLEET_DATA_DIR": str(server.data_dir)})
    assert made.returncode == 0, made.stderr
    assert embedded_ca(config) == server.ca.read_bytes()
    got = subprocess.run([KUBECTLS[version], "--kubeconfig", str(config), "get", "hypervisors", "-o", "name"],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr


def test_the_default_data_dir_is_servers_default(server: Server, tmp_path: Path) -> None:
    """Run where `hvfleet serve` ran without --data-dir: ./hvfleet-data."""
    (tmp_path / "hvfleet-data").symlink_to(server.data_dir)
    made = kubeconfig("--server", server.url, "--token", server.tokens["viewer"], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    cluster = yaml.safe_load(made.stdout)["clusters"][0]["cluster"]
    assert base64.b64decode(cluster["certificate-authority-data"]) == server.ca.read_bytes()


def test_a_ca_that_did_not_sign_the_running_server_is_refused(server: Server, tmp_path: Path) -> None:
    ensure_serving_certificate(tmp_path / "other", "127.0.0.1")  # another server's data dir
    config = tmp_path / "k.yaml"
    made = kubeconfig("--server", server.url, "--token", server.tokens["viewer"],
                      "--data-dir", str(tmp_path / "other"), "-o", str(config))
    assert made.returncode == 2, made
    assert made.stderr.startswith(f"error: ca: {server.url} serves a certificate the CA in ")
    assert "pass --ca FILE" in made.stderr
    assert not config.exists()


def test_no_local_ca_is_refused_with_a_hint(server: Server, tmp_path: Path) -> None:
    made = kubeconfig("--server", server.url, "--token", server.tokens["viewer"],
                      "--data-dir", str(tmp_path / "empty"))
    assert made.returncode == 2, made
    assert made.stderr.startswith(f"error: ca: no CA of a local hvfleet serve at {tmp_path}/empty/tls/ca.crt")
    assert "name the server's data dir" in made.stderr
    assert "pass --ca FILE, or --data-dir DIR" in made.stderr
    assert made.stdout == ""


def test_a_server_elsewhere_needs_its_ca_named(server: Server, tmp_path: Path) -> None:
    made = kubeconfig("--server", "https://hvfleet.example.com:8443", "--token", server.tokens["viewer"],
                      env={"HVFLEET_DATA_DIR": str(server.data_dir)})
    assert made.returncode == 2, made
    assert made.stderr.startswith("error: ca: hvfleet.example.com is not this machine")
    assert "give the CA for https://hvfleet.example.com:8443" in made.stderr
    assert "pass --ca FILE" in made.stderr


def test_a_local_server_not_running_yet_gets_its_data_dirs_ca(server: Server, tmp_path: Path) -> None:
    """Nothing answers on the port: the CA cannot be checked, and is the one there."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        url = f"https://127.0.0.1:{unused.getsockname()[1]}"
        made = kubeconfig("--server", url, "--token", server.tokens["viewer"],
                          "--data-dir", str(server.data_dir))
    assert made.returncode == 0, made.stderr
    cluster = yaml.safe_load(made.stdout)["clusters"][0]["cluster"]
    assert base64.b64decode(cluster["certificate-authority-data"]) == server.ca.read_bytes()


def test_plain_http_needs_no_ca(server: Server) -> None:
    made = kubeconfig("--server", "http://127.0.0.1:8080", "--token", server.tokens["viewer"],
                      "--data-dir", "/nonexistent")
    assert made.returncode == 0, made.stderr
    assert "certificate-authority-data" not in made.stdout


@pytest.mark.parametrize(
    ("host", "local"),
    [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
     (socket.gethostname(), True), ("192.0.2.1", False), ("hvfleet.example.com", False)],
)
def test_is_this_machine(host: str, local: bool) -> None:
    assert is_this_machine(host) is local
