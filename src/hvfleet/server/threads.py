"""The worker threads a request's blocking work runs in (the store's calls).

`await in_thread(fn, *args)` is `loop.run_in_executor` on one pool of 40
threads (as many as Starlette's `run_in_threadpool` allows through anyio's
default limiter). anyio's own hand-off (a capacity limiter, a cancel scope and
its worker bookkeeping per call) cost about twice the CPU of the executor's
under concurrent requests, on every write (docs/scaling.md, "The cost of a
write"). One difference: a request cancelled while its work runs (the client
went away) stops waiting at once, while the work itself (a write and its
audit line) still completes in its thread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

WORKERS = 40
_pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="hvfleet-request")


async def in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` in a worker thread, awaited."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool, functools.partial(fn, *args, **kwargs))
