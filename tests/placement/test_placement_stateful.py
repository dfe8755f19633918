"""hvfleet's Placement API against real Placement 16.0 (in process), driven
by hypothesis through random lives of providers and consumers: providers
created (nested under others), their inventories, traits and aggregates set
(with the generation read, or a stale one), allocations written across one or
two providers (with the consumer generation read, or a stale one), deleted,
providers deleted, and candidates and providers asked for within one tree
of the life (resources, required and forbidden traits, member_of, a
suffixed group: any order). Every request goes to both at microversion 1.39, and each
answer must agree: the status, Placement's error code, and for a success
the document (links aside: their mount differs), then the provider's own
reads (itself, inventories, usages, traits, aggregates, allocations) and the
consumer's allocations. hvfleet serves over HTTPS (`hvfleet serve`'s app,
real tokens, SQLite); its providers here are stored ones (the hypervisors'
rules are tested in test_placement_claims.py)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, multiple, rule

from tests.placement import inprocess_placement as real
from tests.placement.support import Placement, _served_sqlite

VERSION = "1.39"
CLASSES = ["VCPU", "MEMORY_MB", "DISK_GB", "CUSTOM_STATEFUL"]
TRAITS = ["HW_CPU_X86_AVX2", "STORAGE_DISK_SSD", "CUSTOM_STATEFUL_T"]
AGGS = [str(uuid.UUID(int=i + 1)) for i in range(3)]

_API: Placement | None = None


@pytest.fixture(scope="module", autouse=True)
def api() -> Iterator[Placement]:
    global _API
    for served in _served_sqlite(seeded=False):
        _API = served
        for path in ("/resource_classes/CUSTOM_STATEFUL", "/traits/CUSTOM_STATEFUL_T"):
            assert served.call("PUT", path).status_code in (201, 204)
        real.ensure_custom(classes=["CUSTOM_STATEFUL"], traits=["CUSTOM_STATEFUL_T"])
        yield served
    _API = None


def _strip(doc: Any) -> Any:
    """The document without links (their mount differs) and with request ids
    gone; aggregates and traits as sets (Placement lists a provider's
    aggregates in the order its database first saw each one: no order a
    client can rely on)."""
    if isinstance(doc, dict):
        return {k: sorted(v) if k in ("aggregates", "traits") and isinstance(v, list) else _strip(v)
                for k, v in doc.items() if k not in ("links", "request_id")}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


def _answer(status: int, doc: Any) -> tuple[int, Any]:
    if isinstance(doc, dict) and "errors" in doc:
        return status, [e.get("code") for e in doc["errors"]]
    return status, _strip(doc)


def _unordered(answer: tuple[int, Any]) -> tuple[int, Any]:
    status, doc = answer
    if isinstance(doc, dict):
        doc = {k: sorted(v, key=json.dumps) if k in ("allocation_requests", "resource_providers")
               and isinstance(v, list) else v for k, v in doc.items()}
    return status, doc


class PlacementPair(RuleBasedStateMachine):
    """One life, asked of both."""

    providers = Bundle("providers")
    consumers = Bundle("consumers")

    def __init__(self) -> None:
        super().__init__()
        self.created: list[str] = []
        self.allocated: set[str] = set()
        self.hidden: set[str] = set()  # consumers a POST emptied (see post_allocations)

    def both(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert _API is not None
        r = _API.call(method, path, body=body, version=VERSION)
        ours = _answer(r.status_code, r.json() if r.content else None)
        theirs = _answer(*real.call(method, path, body, VERSION))
        assert ours == theirs, f"{method} {path} {body}: hvfleet {ours} != Placement {theirs}"
        return ours

    def same_reads(self, rp: str) -> None:
        for tail in ("", "/inventories", "/usages", "/traits", "/aggregates", "/allocations"):
            self.both("GET", f"/resource_providers/{rp}{tail}")

    def generation(self, rp: str, stale: bool) -> int:
        status, doc = self.both("GET", f"/resource_providers/{rp}")
        return (doc["generation"] if status == 200 else 0) + (1 if stale else 0)

    def put_with_generation(self, rp: str, stale: bool, what: str, value: Any) -> None:
        """PUT the provider's `what` (inventories, traits, aggregates) naming
        the generation read (or a stale one), then every read of it."""
        self.both("PUT", f"/resource_providers/{rp}/{what}",
                  {"resource_provider_generation": self.generation(rp, stale), what: value})
        self.same_reads(rp)

    @initialize()
    def clean_start(self) -> None:
        self.created, self.allocated, self.hidden = [], set(), set()

    @rule(target=providers, parent=st.none() | providers)
    def create(self, parent: str | None) -> Any:
        rp = str(uuid.uuid4())
        body: dict[str, Any] = {"name": f"rp-{rp}", "uuid": rp}
        if parent is not None:
            body["parent_provider_uuid"] = parent
        status, _ = self.both("POST", "/resource_providers", body)
        if status != 200:
            return multiple()
        self.created.append(rp)
        return rp

    @rule(rp=providers, stale=st.booleans(),
          inventories=st.dictionaries(st.sampled_from(CLASSES), st.fixed_dictionaries(
              {"total": st.integers(1, 12)}, optional={
                  "reserved": st.integers(0, 3), "max_unit": st.integers(1, 12),
                  "step_size": st.sampled_from([1, 2]),
                  "allocation_ratio": st.sampled_from([1.0, 2.0, 0.5])}), max_size=3))
    def set_inventories(self, rp: str, stale: bool, inventories: dict[str, dict[str, Any]]) -> None:
        self.put_with_generation(rp, stale, "inventories", inventories)

    @rule(rp=providers, stale=st.booleans(), traits=st.lists(st.sampled_from(TRAITS), unique=True))
    def set_traits(self, rp: str, stale: bool, traits: list[str]) -> None:
        self.put_with_generation(rp, stale, "traits", traits)

    @rule(rp=providers, stale=st.booleans(), aggs=st.lists(st.sampled_from(AGGS), unique=True))
    def set_aggregates(self, rp: str, stale: bool, aggs: list[str]) -> None:
        self.put_with_generation(rp, stale, "aggregates", aggs)

    @rule(target=consumers)
    def new_consumer(self) -> str:
        return str(uuid.uuid4())

    @rule(consumer=consumers, stale=st.booleans(), picks=st.lists(
        st.tuples(st.sampled_from(CLASSES), st.integers(1, 6)), min_size=0, max_size=2),
        data=st.data())
    def allocate(self, consumer: str, stale: bool, picks: list[tuple[str, int]], data: st.DataObject) -> None:
        if not self.created or consumer in self.hidden:
            return
        allocations: dict[str, dict[str, dict[str, int]]] = {}
        for rc, n in picks:
            rp = data.draw(st.sampled_from(self.created))
            allocations.setdefault(rp, {"resources": {}})["resources"][rc] = n
        status, doc = self.both("GET", f"/allocations/{consumer}")
        if not allocations and not doc.get("allocations"):
            # Placement keeps the consumer an empty PUT names when it had no
            # allocations (generation 0, which no GET shows: the next PUT with
            # a null generation is its 409); hvfleet keeps none, as after a
            # DELETE (docs/placement.md, "Deliberate differences").
            return
        gen = doc.get("consumer_generation") if status == 200 else None
        if stale:
            gen = (gen or 0) + 1
        self.both("PUT", f"/allocations/{consumer}", {
            "allocations": allocations, "project_id": "proj", "user_id": "user",
            "consumer_generation": gen, "consumer_type": "INSTANCE"})
        self.allocated.add(consumer)
        self.both("GET", f"/allocations/{consumer}")
        for rp in allocations:
            self.same_reads(rp)
        self.both("GET", "/usages?project_id=proj&user_id=user")

    @rule(rp=providers, picks=st.lists(st.tuples(st.sampled_from(CLASSES), st.integers(1, 4)),
                                       min_size=1, max_size=2, unique_by=lambda t: t[0]),
          required=st.lists(st.sampled_from(TRAITS + ["!" + t for t in TRAITS]), max_size=2,
                            unique_by=lambda t: t.lstrip("!")),
          member_of=st.none() | st.sampled_from(AGGS), suffixed=st.booleans())
    def candidates(self, rp: str, picks: list[tuple[str, int]], required: list[str],
                   member_of: str | None, suffixed: bool) -> None:
        """Candidates within one tree of this life (`in_tree`: the other
        lives' providers are out of it), and the providers listed by the
        same filters."""
        resources = ",".join(f"{rc}:{n}" for rc, n in picks)
        group = "1" if suffixed else ""
        query = f"resources{group}={resources}&in_tree{group}={rp}"
        if required:
            query += f"&required{group}={','.join(required)}"
        if member_of:
            query += f"&member_of{group}={member_of}"
        self.both_unordered("GET", f"/allocation_candidates?{query}")
        listed = f"/resource_providers?in_tree={rp}&resources={resources}"
        if required:
            listed += f"&required={','.join(required)}"
        if member_of:
            listed += f"&member_of={member_of}"
        self.both_unordered("GET", listed)

    def both_unordered(self, method: str, path: str) -> tuple[int, Any]:
        """`both`, lists of candidates and providers taken in any order
        (Placement's order is its database's)."""
        assert _API is not None
        r = _API.call(method, path, version=VERSION)
        ours = _unordered(_answer(r.status_code, r.json() if r.content else None))
        theirs = _unordered(_answer(*real.call(method, path, None, VERSION)))
        assert ours == theirs, f"{method} {path}: hvfleet {ours} != Placement {theirs}"
        return ours

    @rule(rp=providers, stale=st.booleans(), rc=st.sampled_from(CLASSES),
          inventory=st.fixed_dictionaries({"total": st.integers(1, 12)}, optional={
              "reserved": st.integers(0, 3), "max_unit": st.integers(1, 12),
              "allocation_ratio": st.sampled_from([1.0, 2.0])}),
          drop=st.booleans())
    def set_one_inventory(self, rp: str, stale: bool, rc: str, inventory: dict[str, Any],
                          drop: bool) -> None:
        """One class's inventory PUT, or DELETEd, on its own path."""
        path = f"/resource_providers/{rp}/inventories/{rc}"
        if drop:
            self.both("DELETE", path)
        else:
            self.both("PUT", path, {"resource_provider_generation": self.generation(rp, stale), **inventory})
        self.both("GET", path)
        self.same_reads(rp)

    @rule(rp=providers, what=st.sampled_from(["inventories", "traits"]))
    def delete_all(self, rp: str, what: str) -> None:
        """Every inventory, or every trait, DELETEd at once."""
        self.both("DELETE", f"/resource_providers/{rp}/{what}")
        self.same_reads(rp)

    @rule(rp=providers, parent=st.none() | providers, rename=st.booleans())
    def update(self, rp: str, parent: str | None, rename: bool) -> None:
        """A provider renamed (maybe to another's name) or moved under
        another parent, or out from under its own (1.37)."""
        status, doc = self.both("GET", f"/resource_providers/{rp}")
        if status != 200:
            return
        name = f"rp-{parent}" if rename and parent is not None else doc["name"]
        self.both("PUT", f"/resource_providers/{rp}", {"name": name, "parent_provider_uuid": parent})
        self.both("GET", f"/resource_providers/{rp}")
        if parent is not None:
            self.both_unordered("GET", f"/resource_providers?in_tree={parent}")

    @rule(picks=st.lists(st.tuples(st.sampled_from(CLASSES), st.integers(1, 4)), max_size=3),
          emptied=st.integers(0, 2), kind=st.sampled_from(["INSTANCE", "MIGRATION"]), data=st.data())
    def post_allocations(self, picks: list[tuple[str, int]], emptied: int, kind: str,
                         data: st.DataObject) -> None:
        """Several consumers' allocations in one POST (as Nova moves an
        instance's to its migration; a consumer given none is emptied), then
        the usages by type."""
        if not self.created:
            return
        body: dict[str, Any] = {}

        def entry(consumer: str) -> dict[str, Any]:
            if consumer not in body:
                _, held = self.both("GET", f"/allocations/{consumer}")
                body[consumer] = {"allocations": {}, "project_id": "proj", "user_id": "user",
                                  "consumer_type": kind,
                                  "consumer_generation": held.get("consumer_generation")}
            return body[consumer]  # type: ignore[no-any-return]

        for _ in range(min(emptied, len(self.allocated))):  # (hidden ones are not in it)
            entry(data.draw(st.sampled_from(sorted(self.allocated))))
        for rc, n in picks:
            consumer = data.draw(st.sampled_from([*sorted(self.allocated), "new"]))
            allocations = entry(str(uuid.uuid4()) if consumer == "new" else consumer)["allocations"]
            rp = data.draw(st.sampled_from(self.created))
            allocations.setdefault(rp, {"resources": {}})["resources"][rc] = n
        if not body:
            return
        status, _ = self.both("POST", "/allocations", body)
        self.allocated |= set(body)
        if status == 204:
            # A consumer a POST empties stays in Placement, with a generation
            # no GET shows (its next write naming none is a 409 there); hvfleet
            # keeps none (docs/placement.md, "Deliberate differences"). Not
            # named again in this life.
            emptied_now = {c for c, entry in body.items() if not entry["allocations"]}
            self.hidden |= emptied_now
            self.allocated -= emptied_now
        for consumer in body:
            self.both("GET", f"/allocations/{consumer}")
        for which in ("INSTANCE", "MIGRATION", "all", "unknown"):
            self.both("GET", f"/usages?project_id=proj&consumer_type={which}")

    @rule(consumer=consumers)
    def release(self, consumer: str) -> None:
        self.both("DELETE", f"/allocations/{consumer}")
        self.both("GET", f"/allocations/{consumer}")

    @rule(rp=consumes(providers))
    def delete(self, rp: str) -> None:
        status, _ = self.both("DELETE", f"/resource_providers/{rp}")
        if status == 204:
            self.created.remove(rp)
        self.both("GET", f"/resource_providers/{rp}")

    def teardown(self) -> None:
        # Leave neither side anything the next life could trip on.
        for consumer in self.allocated | self.hidden:
            real.call("DELETE", f"/allocations/{consumer}")
            if _API is not None:
                _API.call("DELETE", f"/allocations/{consumer}")
        left = list(reversed(self.created))
        while left:  # children first; a provider moved under a later one goes in a later pass
            still = [rp for rp in left if real.call("DELETE", f"/resource_providers/{rp}")[0] == 409]
            if _API is not None:
                for rp in left:
                    _API.call("DELETE", f"/resource_providers/{rp}")
            if len(still) == len(left):
                break
            left = still


# Derandomized: the same 40 lives in every run, so a difference one run finds
# every run finds (a random one, shrinking past the test timeout, read as a
# hang in CI). To explore new lives: HVFLEET_EXPLORE=1 with --hypothesis-seed=N.
PlacementPair.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None,
    derandomize=not os.environ.get("HVFLEET_EXPLORE"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
test_hvfleet_and_placement_agree_through_random_lives = PlacementPair.TestCase


def test_the_differences_the_machine_found_stay_fixed() -> None:
    """The same traits PUT again (Placement writes nothing: the generation
    stays), a reserve past the total at a ratio below 1 (Placement takes it:
    its capacity rounds to 0), and a loop refused before a taken name."""
    m = PlacementPair()
    try:
        rp = m.create(None)
        for traits in ([], [], ["HW_CPU_X86_AVX2"], ["HW_CPU_X86_AVX2"]):
            m.set_traits(rp, False, traits)
        m.set_inventories(rp, False, {"VCPU": {"total": 1, "reserved": 2, "allocation_ratio": 0.5}})
        m.set_inventories(rp, False, {"VCPU": {"total": 1, "reserved": 3, "allocation_ratio": 0.5}})
        # Session 14: a move under its own child and a rename to a taken name at
        # once: Placement refuses the loop (400) before it meets the name (409).
        child = m.create(rp)
        m.update(rp, child, True)
    finally:
        m.teardown()
