"""A watch fan-out subscriber that takes events on the fan-out's thread
(`Subscription` `direct`, the dashboard's follower): whatever the order of
arrivals, batches taken by the loop and verdicts of the direct consumer, every
event is consumed exactly once and in order (hypothesis), and the direct
consumer is never asked while the loop holds or has queued earlier events."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvfleet.model import Hypervisor
from hvfleet.server.watch import KindFanout
from hvfleet.store import open_store
from hvfleet.store.base import WatchEvent
from tests.support.loops import run_on_own_thread


def _event(revision: int) -> WatchEvent:
    return WatchEvent("MODIFIED", Hypervisor.model_validate({"metadata": {"name": "hv0"}}), revision)


# One step: an event arrives (the direct consumer's verdict if asked), or the
# loop takes what is queued (and finishes with it before the next step or not).
step = st.one_of(st.tuples(st.just("arrive"), st.booleans()),
                 st.tuples(st.just("batch"), st.booleans()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, max_size=30))
def test_every_event_is_consumed_once_and_in_order(tmp_path: Path, steps: list[tuple[str, bool]]) -> None:
    with open_store(f"sqlite:///{tmp_path}/w.db") as store:
        # Nothing is written to the store: the fan-out's own thread delivers
        # nothing, the test hands events over as that thread would (`_take`).
        fanout = KindFanout(store, "Hypervisor", 100)
        try:
            consumed: list[int] = []
            asked_while_behind: list[int] = []

            async def body() -> None:
                loop = asyncio.get_running_loop()
                verdicts: list[bool] = []
                held = [True]  # the replay is the subscriber's until it says done
                queued: list[int] = []

                def direct(events: list[WatchEvent]) -> bool:
                    if held[0] or queued:
                        asked_while_behind.append(events[0].revision)
                    verdict = verdicts.pop()
                    if verdict:
                        consumed.extend(e.revision for e in events)
                    return verdict

                sub, _, _ = fanout.subscribe(0, None, 1000, loop, direct=direct)
                sub.done()
                held[0] = False
                revision = 0
                for kind, flag in steps:
                    if kind == "arrive":
                        revision += 1
                        verdicts.append(flag)
                        before = len(consumed)
                        fanout._take([_event(revision)])
                        if len(consumed) == before:
                            queued.append(revision)
                            verdicts.clear()  # not asked, or said no
                    else:
                        if held[0]:  # the follower is done with a batch before it takes the next
                            sub.done()
                            held[0] = False
                        await asyncio.sleep(0)  # the wake-up runs
                        events, _ = await sub.next_batch(0.01)
                        assert [e.revision for e in events] == queued
                        held[0] = bool(events)
                        consumed.extend(e.revision for e in events)
                        queued.clear()
                        if flag:  # finished with now; else still held at the next arrival
                            sub.done()
                            held[0] = False
                await asyncio.sleep(0)
                events, _ = await sub.next_batch(0.01)
                consumed.extend(e.revision for e in events)
                fanout.unsubscribe(sub)

            run_on_own_thread(body())
            assert consumed == list(range(1, len(consumed) + 1))
            assert len(consumed) == sum(1 for kind, _ in steps if kind == "arrive")
            assert asked_while_behind == []
        finally:
            fanout.close()
