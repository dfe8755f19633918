"""Running a coroutine to completion from a test, whatever runs on the test's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_on_own_thread(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """`asyncio.run(coro)` on a thread of its own, its result or exception
    handed back. A session's Playwright (sync API) keeps an event loop running
    on the test thread once a browser test has run, and asyncio.run() refuses
    to start there: such a test passes alone and fails in the whole suite."""
    out: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(asyncio.run(coro))
        except BaseException as exc:  # re-raised below, on the test's thread
            failed.append(exc)

    runner = threading.Thread(target=run, name="test-loop")
    runner.start()
    runner.join(timeout)
    assert not runner.is_alive(), f"the coroutine did not finish within {timeout:g} s"
    if failed:
        raise failed[0]
    return out[0]
