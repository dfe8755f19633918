"""Fixtures shared by all tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hvfleet.model import Hypervisor
from hvfleet.store.etcd_local import EtcdCluster


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
