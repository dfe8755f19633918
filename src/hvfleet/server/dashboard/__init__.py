"""The fleet dashboard served by `hvfleet serve` at `/` (docs/dashboard.md):
`routes()` for the app's route table, and `start`/`stop` for its lifespan,
which keep the dashboard's live picture (live.FleetState) following the API's
watch fan-out and its history (history.py) in the store."""

from __future__ import annotations

import asyncio
import contextlib

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool

from hvfleet.model.errors import HvfleetError
from hvfleet.server.context import ApiContext
from hvfleet.server.dashboard.history import HistoryKeeper, HistorySettings, SamplerTurn, keep
from hvfleet.server.dashboard.live import FleetState, Follower
from hvfleet.server.dashboard.metrics import registry_for
from hvfleet.server.dashboard.pages import routes
from hvfleet.server.dashboard.session import load_key

__all__ = ["routes", "start", "stop"]


async def start(app: Starlette) -> None:
    ctx: ApiContext = app.state.ctx
    state = FleetState(ctx.store)
    follower = Follower(state, ctx.hub)
    app.state.dashboard = state
    ctx.fleet_hosts = state.hosts_snapshot  # the index's first build reads them
    app.state.dashboard_metrics = registry_for(state)
    app.state.dashboard_follower = follower
    settings: HistorySettings = getattr(app.state, "history_settings", None) or HistorySettings.parse()
    # One replica over the store keeps the history at a time (history.SamplerTurn).
    app.state.history = HistoryKeeper(ctx.store, settings, turn=SamplerTurn(ctx.store))
    await follower.start()
    with contextlib.suppress(HvfleetError):  # else read on first use
        app.state.dashboard_key = await run_in_threadpool(load_key, ctx.store)
    app.state.history_task = asyncio.create_task(keep(app.state.history, state))


async def stop(app: Starlette) -> None:
    follower: Follower | None = getattr(app.state, "dashboard_follower", None)
    if follower is not None:
        await follower.stop()
    task: asyncio.Task[None] | None = getattr(app.state, "history_task", None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    keeper: HistoryKeeper | None = getattr(app.state, "history", None)
    if keeper is not None and keeper.turn is not None and keeper.holding:
        # Another replica takes the history over at its next sample, not after the ttl.
        with contextlib.suppress(HvfleetError, ValueError):
            await run_in_threadpool(keeper.turn.release)
