"""One client's watch as an HTTP response: newline-delimited JSON events.

The order is: the current objects as ADDED (when no resourceVersion was
given, or with sendInitialEvents=true), for a watch-list the BOOKMARK
annotated `k8s.io/initial-events-end` at the version of those objects, a
catch-up from the store when the version is older than the fan-out's kept
history, the kept history, then live events from the client's own
queue; an event is sent at most once (by revision), as a label-selected watch
sees it (`seen_through`: entering the selection is ADDED, leaving it DELETED).
Every write to the socket has a deadline (`send_timeout`) and a client whose
queue overflowed gets an ERROR event with an Expired (410) Status and is
dropped, so one slow reader holds nothing but its own queue. The stream ends
after timeoutSeconds, or with an ERROR event (401) once the caller's token
is revoked or expired (checked every `Limits.token_recheck` seconds), or as
soon as the server begins to stop (`ApiContext.stopping`): complete, so the
client watches again from its last resourceVersion, on another replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from hvfleet.model.errors import Gone
from hvfleet.model.hypervisor import Resource
from hvfleet.model.meta import API_VERSION
from hvfleet.model.selectors import Selector
from hvfleet.server.auth import no_longer_in_force
from hvfleet.server.context import ApiContext
from hvfleet.server.field_selector import FieldSelector
from hvfleet.server.narrowing import View
from hvfleet.server.negotiation import PARTIAL, Form, partial_metadata
from hvfleet.server.read_options import INITIAL_EVENTS_END
from hvfleet.server.status import status
from hvfleet.server.table import TableInputs, table
from hvfleet.server.watch import KindFanout, catch_up_batch, seen_through
from hvfleet.store.base import WatchEvent

log = logging.getLogger("hvfleet.server")


class _Dropped(Exception):
    """The client did not take a write within the send timeout."""


class WatchResponse(Response):
    """A streaming response; a Starlette Response only so handlers have one type."""

    def __init__(self, ctx: ApiContext, fanout: KindFanout, kind: str, since: int,
                 initial: list[Resource] | None, *, selector: Selector, names: FieldSelector,
                 bookmarks: bool, timeout: float, form: Form,
                 include_object: str, release: Callable[[], None],
                 view: Callable[[], View] | None = None,
                 authorization: str | None = None,
                 initial_events_end: bool = False) -> None:
        self.ctx = ctx
        self.fanout = fanout
        self.kind = kind
        self.since = since
        self.initial = initial
        self.selector = selector
        self.names = names
        self.bookmarks = bookmarks
        self.timeout = timeout
        self.form = form
        self.as_table = form.table
        # Each event's object turned into a Table or its metadata (a watch
        # asked for as PartialObjectMetadataList sends the objects, as kube's).
        self.transformed = form.table or form.kind == PARTIAL
        self.include_object = include_object
        self.release = release
        # A narrowed watch (an agent's policies): what it may see, read again
        # for every batch, as the host's labels may change while it watches.
        self.view = view
        # The caller's credentials, checked again every `token_recheck` seconds.
        self.authorization = authorization
        self.initial_events_end = initial_events_end
        self._send: Send | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._send = send
        dropped = False
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"cache-control", b"no-cache")]})
            async with anyio.create_task_group() as tg:
                async def on_disconnect() -> None:
                    while True:
                        message: Message = await receive()
                        if message["type"] == "http.disconnect":
                            tg.cancel_scope.cancel()
                            return

                async def on_stop() -> None:
                    # The server is stopping: the answer ends as a timeout would end it.
                    await self.ctx.stopping.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(on_disconnect)
                tg.start_soon(on_stop)
                try:
                    await self._stream()
                except _Dropped:
                    dropped = True
                tg.cancel_scope.cancel()
            if not dropped:
                await self._write(b"", more=False)
        except (_Dropped, OSError):
            pass  # the client is gone or stuck; returning lets the server close the socket
        finally:
            self.release()

    async def _write(self, data: bytes, more: bool = True) -> None:
        assert self._send is not None
        try:
            # A deadline on this task, not wait_for's task per write.
            async with asyncio.timeout(self.ctx.limits.watch.send_timeout):
                await self._send({"type": "http.response.body", "body": data, "more_body": more})
        except TimeoutError:
            raise _Dropped() from None

    def _wanted(self, obj: Resource) -> bool:
        return self._named(obj) and self.selector.matches(obj.metadata.labels)

    def _named(self, obj: Resource) -> bool:
        return self._is_named(obj.metadata.name)

    def _is_named(self, n: str) -> bool:
        return self.names.matches(n)

    async def _event(self, type_: str, obj: Resource, inputs: TableInputs | None = None) -> None:
        if self.as_table and inputs is None:
            inputs = await run_in_threadpool(self.ctx.table_inputs, self.kind)
        await self._write(self._line(type_, obj, inputs))

    def _line(self, type_: str, obj: Resource, inputs: TableInputs | None) -> bytes:
        if self.as_table:
            assert inputs is not None
            body = table(self.kind, [obj], inputs, obj.metadata.resource_version or "",
                         self.include_object, api_version=self.form.meta_api_version)
        elif self.transformed:
            body = partial_metadata(obj.to_dict()["metadata"], self.form)
        else:
            body = obj.to_dict()
        return json.dumps({"type": type_, "object": body}).encode() + b"\n"

    async def _error(self, code: int, reason: str, message: str) -> None:
        await self._write(json.dumps({"type": "ERROR",
                                      "object": status(code, reason, message)}).encode() + b"\n")

    async def _still_authenticated(self) -> bool:
        """Whether the caller's token is still in force; if not, the stream's
        last event says why (a revoked or expired token watches no longer)."""
        why = await no_longer_in_force(self.ctx.authenticator, self.authorization)
        if why is not None:
            await self._error(401, "Unauthorized", why)
            return False
        return True

    async def _bookmark(self, revision: int, initial_events_end: bool = False) -> None:
        meta: dict[str, object] = {"resourceVersion": str(revision)}
        if initial_events_end:
            # What client-go's watch-list (kubectl wait, informers) waits for
            # before it counts the initial state as complete.
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        obj = {"kind": self.kind, "apiVersion": API_VERSION, "metadata": meta}
        await self._write(json.dumps({"type": "BOOKMARK", "object": obj}).encode() + b"\n")

    async def _stream(self) -> None:
        limits = self.ctx.limits.watch
        deadline = time.monotonic() + self.timeout
        loop = asyncio.get_running_loop()
        sub, replay, catch_up = self.fanout.subscribe(self.since, self.names.equal, limits.queue, loop)
        last = self.since
        # Names already sent at revision `last` (None: all of them, as for `since`):
        # one etcd batch is one revision for all its objects, and catch-up, history
        # and queue may each hold some of them.
        sent_at_last: set[str] | None = None

        async def deliver(events: list[WatchEvent]) -> None:
            """The events' lines, written as one chunk (a batch that arrived
            together is one TLS record and one send, not one per event)."""
            nonlocal last, sent_at_last
            view = await run_in_threadpool(self.view) if self.view is not None and events else None
            inputs = (await run_in_threadpool(self.ctx.table_inputs, self.kind)
                      if self.as_table and events and view is None else None)
            if view is not None and self.as_table:
                inputs = view.table_inputs
            lines: list[bytes] = []
            # Sent as the fan-out encoded it when nothing here looks into the
            # object (no selector, no narrowing, no table): from the stored
            # bytes, without a decode, when the store vouched for them.
            as_is = not self.transformed and view is None and not self.selector.requirements
            for ev in events:
                name = ev.name
                if ev.revision < last or (ev.revision == last and (sent_at_last is None
                                                                   or name in sent_at_last)):
                    continue
                if ev.revision > last:
                    last, sent_at_last = ev.revision, set()
                assert sent_at_last is not None
                sent_at_last.add(name)
                if not self._is_named(name):
                    continue
                if as_is:
                    lines.append(self.fanout.encoded(ev))
                    continue
                seen = seen_through(ev, self.selector, None if view is None else view.visible)
                if seen is None:
                    continue
                type_, obj = seen
                if self.transformed or type_ != ev.type or obj is not ev.object:
                    lines.append(self._line(type_, obj, inputs))
                else:
                    lines.append(self.fanout.encoded(ev))
            if lines:
                await self._write(b"".join(lines))

        try:
            view = await run_in_threadpool(self.view) if self.view is not None else None
            inputs = (await run_in_threadpool(self.ctx.table_inputs, self.kind)
                      if self.as_table and self.initial and view is None else None)
            if view is not None and self.as_table:
                inputs = view.table_inputs
            for obj in self.initial or []:
                if self._wanted(obj) and (view is None or view.visible(obj)):
                    await self._event("ADDED", obj, inputs)
            if self.initial_events_end:
                # The initial objects are the state at `since`: the bookmark says so.
                await self._bookmark(self.since, initial_events_end=True)
            if catch_up is not None:
                try:
                    stream = self.ctx.store.watch(self.kind, since=self.since, name=self.names.equal,
                                                  timeout=0.2)
                    done = False
                    while not done:
                        batch, done = await run_in_threadpool(catch_up_batch, stream, catch_up)
                        await deliver(batch)
                except Gone as exc:
                    # kube's words; the store's (which may name the store) go to the log.
                    log.info("watch %s from %s: %s", self.kind, self.since, exc)
                    await self._error(410, "Expired", f"too old resource version: {self.since}")
                    return
            await deliver(replay)
            last_bookmark = checked = time.monotonic()
            bookmark_rv = self.since
            recheck = self.ctx.limits.token_recheck
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                wait = min(remaining, limits.bookmark_interval) if self.bookmarks else remaining
                events, position = await sub.next_batch(min(wait, recheck))
                if self.authorization is not None and time.monotonic() - checked >= recheck:
                    checked = time.monotonic()
                    if not await self._still_authenticated():
                        return
                if sub.overflowed:
                    await self._error(410, "Expired", "the watch fell too far behind and was dropped; "
                                      "list again and watch from the list's resourceVersion")
                    return
                if sub.expired:
                    await self._error(410, "Expired", "the store's history moved past this watch; "
                                      "list again")
                    return
                await deliver(events)
                if self.bookmarks and time.monotonic() - last_bookmark >= limits.bookmark_interval:
                    # Every event up to `position` has been handed over and sent by now
                    # (whole revisions only); never move a bookmark backwards.
                    bookmark_rv = max(bookmark_rv, position)
                    await self._bookmark(bookmark_rv)
                    last_bookmark = time.monotonic()
        finally:
            self.fanout.unsubscribe(sub)
