"""The CLI tests' store: a fresh SQLite file named by HVFLEET_STORE.

`run` (tests/conftest.py) runs the real entry point; depending on `db_url`
here makes every CLI test use this test's own store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Run = Callable[..., Any]


@pytest.fixture
def db_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/hvfleet.db"
    monkeypatch.setenv("HVFLEET_STORE", url)
    return url


@pytest.fixture
def run(run: Run, db_url: str) -> Run:
    return run
