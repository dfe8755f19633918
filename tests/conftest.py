"""Fixtures shared by all tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from hvfleet.cli.main import main
from hvfleet.model import Hypervisor
from tests.support.etcd_local import EtcdCluster


@pytest.fixture(scope="session")
def etcd_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One real etcd member (127.0.0.1, free ports, data in a temp dir) shared by the
    session and stopped at its end; tests keep apart by key prefix."""
    with EtcdCluster(tmp_path_factory.mktemp("etcd-session"), size=1) as cluster:
        yield cluster


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
