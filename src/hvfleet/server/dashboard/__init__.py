"""The fleet dashboard served by `hvfleet serve` at `/` (docs/dashboard.md):
`routes()` for the app's route table, and `start`/`stop` for its lifespan,
which keep the dashboard's live picture (live.FleetState) following the API's
watch fan-out."""

from __future__ import annotations

from starlette.applications import Starlette

from hvfleet.server.context import ApiContext
from hvfleet.server.dashboard.live import FleetState, Follower
from hvfleet.server.dashboard.metrics import registry_for
from hvfleet.server.dashboard.pages import routes

__all__ = ["routes", "start", "stop"]


async def start(app: Starlette) -> None:
    ctx: ApiContext = app.state.ctx
    state = FleetState(ctx.store)
    follower = Follower(state, ctx.hub)
    app.state.dashboard = state
    app.state.dashboard_metrics = registry_for(state)
    app.state.dashboard_follower = follower
    await follower.start()


async def stop(app: Starlette) -> None:
    follower: Follower | None = getattr(app.state, "dashboard_follower", None)
    if follower is not None:
        await follower.stop()
