"""Fixtures shared by all tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hvfleet.model import Hypervisor


@pytest.fixture
def make_hypervisor() -> Callable[..., Hypervisor]:
    def make(name: str = "hv1", **fields: Any) -> Hypervisor:
        data: dict[str, Any] = {"metadata": {"name": name, **fields.pop("metadata", {})}}
        data.update(fields)
        return Hypervisor.model_validate(data)

    return make
