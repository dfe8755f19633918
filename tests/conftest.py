"""Fixtures shared by all tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from hvfleet.cli.main import main
from hvfleet.model import Hypervisor
from tests.support import serve
from tests.support.etcd_local import EtcdCluster
from tests.support.serve import Server


@pytest.fixture(scope="session")
def etcd_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One real etcd member (127.0.0.1, free ports, data in a temp dir) shared by the
    session and stopped at its end; tests keep apart by key prefix."""
    with EtcdCluster(tmp_path_factory.mktemp("etcd-session"), size=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One real `hvfleet serve` (TLS, its own CA, a SQLite store, a token per role)
    for the session (per xdist worker: free port, a temp dir of its own), started
    on first use. Tests take it as `server`, which empties its store first."""
    tmp = tmp_path_factory.mktemp("serve-shared")
    # Longer than any run: the same tokens serve every module.
    tokens = serve.role_tokens(f"sqlite:///{tmp}/hvfleet.db", ttl=timedelta(hours=12))
    srv = serve.start_server(tmp, tokens=tokens)
    try:
        yield srv
    finally:
        serve.stop_server(srv)


@pytest.fixture(scope="module")
def server(shared_server: Server) -> Server:
    """The session's `hvfleet serve`, its store as a new server's (no objects but
    the role tokens) when a module starts using it. A module that needs other
    options, another store or replicas starts its own (serve.start_server)."""
    serve.fresh_store(shared_server)
    return shared_server


@pytest.fixture
def make_hypervisor() -> Callable[..., Hypervisor]:
    def make(name: str = "hv1", **fields: Any) -> Hypervisor:
        data: dict[str, Any] = {"metadata": {"name": name, **fields.pop("metadata", {})}}
        data.update(fields)
        return Hypervisor.model_validate(data)

    return make


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run the real `hvfleet` entry point in-process and capture what a user sees."""

    def invoke(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many `hvfleet serve` processes the fixtures started (this process's, or
    each xdist worker's, reported back through workeroutput)."""
    counts = [serve.started(), *getattr(terminalreporter.config, "_serve_counts", [])]
    terminalreporter.write_line(f"hvfleet serve processes started: {sum(counts)}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    running = sys.modules.get("tests.server.running")
    if running is not None:
        running.wait_stopped()  # the in-process servers tests left stopping (make_api)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["serve_started"] = serve.started()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    config = node.config
    config._serve_counts = [*getattr(config, "_serve_counts", []), node.workeroutput.get("serve_started", 0)]
