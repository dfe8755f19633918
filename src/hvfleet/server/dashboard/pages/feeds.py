"""The event stream (`/dashboard/events`, server-sent events naming the
hosts whose row changed), limited to what the caller may see, and
`may_follow`, which the history (pages/history.py) asks too."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from hvfleet.model.errors import Forbidden, TooManyRequests
from hvfleet.server.auth import no_longer_in_force
from hvfleet.server.context import ApiContext
from hvfleet.server.dashboard.pages.common import (
    Visible,
    ctx_of,
    refused,
    signed_in,
    state_of,
    visible_hosts,
)
from hvfleet.server.dashboard.session import session_token
from hvfleet.server.identity import Identity

# Seconds between comments that keep an idle event stream's connection open.
_KEEPALIVE_S = 15.0
# At most one `change` event per stream in this many seconds (a burst of
# heartbeats is one event), naming at most _MAX_NAMED hosts.
COALESCE_S = 1.0
_MAX_NAMED = 50


def may_follow(ctx: ApiContext, who: Identity, host: str | None) -> Visible:
    """Forbidden unless the caller may see `host` (None: the whole fleet, which
    only a caller who may list every host sees); the hosts it may see."""
    visible = visible_hosts(ctx, who)
    if visible is not None and (host is None or host not in visible):
        what = f'hypervisors.hvfleet.io "{host}"' if host else "the fleet's history"
        raise Forbidden(f'{what} is forbidden: User "{who.subject}" may see only its own '
                        f"hypervisor ({', '.join(sorted(visible))})")
    return visible


async def _next_change(queue: asyncio.Queue[set[str]], stopping: asyncio.Event,
                       wait: float) -> set[str] | None:
    """The next change on `queue`, or None after `wait` seconds or once the
    server begins to stop. A change not taken stays queued."""
    get = asyncio.ensure_future(queue.get())
    stop = asyncio.ensure_future(stopping.wait())
    try:
        done, _ = await asyncio.wait((get, stop), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
    finally:
        get.cancel()
        stop.cancel()
    return get.result() if get in done else None


@signed_in
async def events(request: Request, who: Identity) -> Response:
    """Server-sent events: `change` with the hosts whose row changed (an empty
    list: anything may have changed), from the dashboard's follower of the watch."""
    ctx, state = ctx_of(request), state_of(request)
    host = request.query_params.get("host")
    try:
        visible = may_follow(ctx, who, host) if host is not None else visible_hosts(ctx, who)
        # One pool of streams per token with the API's watches (WatchLimits.per_token).
        release = ctx.hub.acquire(who.token_id)
    except (Forbidden, TooManyRequests) as exc:
        return refused(exc)
    authorization = f"Bearer {session_token(request)}"
    recheck = ctx.limits.token_recheck
    queue = state.listen()

    async def stream() -> Any:
        # Changes are coalesced: the first after a quiet spell goes out at once,
        # later ones at most every COALESCE_S, naming every host changed meanwhile
        # (an empty list: too many, or anything, changed).
        pending: set[str] | None = None
        try:
            yield f"event: hello\ndata: {json.dumps({'version': state.version})}\n\n".encode()
            checked = sent = time.monotonic()
            changed_at = 0.0
            while True:
                names: set[str] | None = None
                now = time.monotonic()
                wait = min(recheck, _KEEPALIVE_S) if pending is None else \
                    max(0.0, changed_at + COALESCE_S - now)
                names = await _next_change(queue, ctx.stopping, wait)
                if ctx.stopping.is_set():
                    return  # the server is stopping: the answer ends, the page reconnects elsewhere
                if time.monotonic() - checked >= recheck:
                    # A revoked or expired token ends the stream (the cache keeps this cheap).
                    checked = time.monotonic()
                    why = await no_longer_in_force(ctx.authenticator, authorization)
                    if why is not None:
                        yield f"event: ended\ndata: {json.dumps({'message': why})}\n\n".encode()
                        return
                if names is not None:
                    if visible is not None and names:
                        names &= visible
                        if not names:
                            continue  # only hosts this caller does not see changed
                    if host is not None and names and host not in names:
                        continue
                    if pending is None:
                        pending = set(names)
                    elif pending and names and len(pending) < _MAX_NAMED:
                        pending |= names
                    else:
                        pending = set()  # anything may have changed
                if pending is None:
                    if time.monotonic() - sent >= _KEEPALIVE_S:
                        sent = time.monotonic()
                        yield b": keepalive\n\n"
                    continue
                if time.monotonic() - changed_at < COALESCE_S:
                    continue
                shown = sorted(pending) if len(pending) <= _MAX_NAMED else []
                data = json.dumps({"hosts": shown, "version": state.version})
                pending = None
                sent = changed_at = time.monotonic()
                yield f"event: change\ndata: {data}\n\n".encode()
        finally:
            state.unlisten(queue)
            release()

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
