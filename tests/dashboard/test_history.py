"""The dashboard's history in the store (server/dashboard/history.py), without a
server: the kept points answer every moment of the window as the full list of
changes would (hypothesis, against a naive reference), replicas sampling the
same bucket over one store (SQLite file, real etcd) write it once and read the
same series, a new process writes nothing for an unchanged fleet, and bad
settings name the option."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.model import Hypervisor
from hvfleet.model.dashboard import HistoryPoint, HistorySeries, HistorySeriesSpec
from hvfleet.model.errors import InvalidInput
from hvfleet.model.meta import ObjectMeta
from hvfleet.server.dashboard import charts
from hvfleet.server.dashboard.history import (
    FLEET,
    MANAGER,
    HistoryKeeper,
    HistorySettings,
    SamplerTurn,
    Tier,
    appending,
    assembled,
    chart_document,
    forget,
    group_figures,
    host_series,
    in_window,
    label_series,
    object_name,
    part_name,
    read_points,
    sample_due,
    stored_series,
    write_point,
)
from hvfleet.server.dashboard.live import FleetState
from hvfleet.store import open_store
from hvfleet.store.base import Store
from hvfleet.store.ownership import agent_manager


def _value_at(points: list[HistoryPoint], t: int) -> dict[str, list[str]] | None:
    before = [p for p in points if p.t <= t]
    return before[-1].v if before else None


def _point(t: int, value: int) -> HistoryPoint:
    return HistoryPoint(t=t, v={"cpu": [str(value), "0", "8"]})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=80),
       st.integers(5, 100), st.integers(1, 6))
def test_kept_points_answer_every_moment_of_the_window_as_all_changes_would(
        steps: list[tuple[int, int]], window: int, part_points: int) -> None:
    """`appending` step by step over a dict standing for the store, as
    write_point does: the series' object and the parts it lists answer every
    moment of the window as the full list of samples would, read whole or
    from a moment on (only the parts reaching past it), and stay small."""
    tier = Tier("1s", 1, window)
    head: HistorySeriesSpec | None = None
    parts: dict[int, HistorySeriesSpec] = {}
    everything: list[HistoryPoint] = []  # the reference: every sample, nothing dropped
    t = 0
    for gap, value in steps:
        t += gap
        point = _point(t, value)
        everything.append(point)
        step = appending(head, "fleet", tier, point, part_points)
        if step is None:
            continue
        if step.moved is not None:
            parts[step.moved.points[0].t] = step.moved
        for first in step.dropped:
            del parts[first]  # listed before, so stored
        head = step.head
    assert head is not None
    assert [p.first for p in head.parts] == sorted(parts)  # no part lost, none left behind
    assert all(parts[p.first].points[0].t == p.first and parts[p.first].points[-1].t == p.last
               for p in head.parts)
    assert len(head.points) <= part_points
    assert len(head.parts) <= window // part_points + 2  # parts before the window go
    kept = assembled(head, [parts[p.first] for p in head.parts])
    assert all(a.t < b.t and a.v != b.v for a, b in pairwise(kept))
    for moment in range(t - window, t + 1):
        assert _value_at(kept, moment) == _value_at(everything, moment), moment
    start = t - window
    for since in (start, (start + t) // 2):
        read = assembled(head, [parts[p.first] for p in head.parts if p.last > since])
        for moment in range(since, t + 1):
            assert _value_at(read, moment) == _value_at(everything, moment), (since, moment)
    shown = in_window(kept, start)
    assert all(p.t >= start for p in shown)
    assert _value_at(shown, start) == _value_at(everything, start)
    # What stored_series seeds is what these steps stored.
    objects = stored_series("fleet", tier, everything, part_points)
    assert objects[0].spec == head
    assert {o.metadata.name: o.spec for o in objects[1:]} == {
        part_name(object_name("fleet", "1s"), first): spec for first, spec in parts.items()}


def test_a_bucket_already_written_or_an_unchanged_value_writes_nothing() -> None:
    tier = Tier("10s", 10, 3600)
    first = appending(None, "fleet", tier, _point(100, 1))
    assert first is not None
    head = first.head
    assert appending(head, "fleet", tier, _point(100, 2)) is None
    assert appending(head, "fleet", tier, _point(110, 1)) is None
    assert appending(head, "fleet", tier, _point(110, 2)) is not None
    # Also right after the object's points moved to a part: its lead is the last point.
    full = appending(head, "fleet", tier, _point(110, 2), part_points=1)
    assert full is not None and full.moved is not None and full.head.lead == _point(100, 1)
    assert appending(full.head, "fleet", tier, _point(120, 2)) is None


@pytest.mark.parametrize(("spec", "words"), [
    ({"points": [{"t": 20}, {"t": 10}]}, "times must increase"),
    ({"points": [{"t": 20}], "lead": {"t": 20}}, "lead: its time (20)"),
    ({"points": [{"t": 20}], "parts": [{"first": 5, "last": 20}]}, "the last must end before"),
    ({"parts": [{"first": 5, "last": 9}, {"first": 9, "last": 12}]}, "each must start after"),
    ({"parts": [{"first": 5, "last": 4}]}, "last (4) is before first (5)"),
])
def test_a_series_out_of_order_is_refused_where_it_is_written(spec: dict[str, object], words: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        HistorySeriesSpec.model_validate({"series": "fleet", "tier": "10s", **spec})
    assert words in str(err.value)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=12), st.sampled_from(["0", "16", "64Gi", "1.5", "500m", "2e3", "-1"])))
def test_a_figure_is_taken_exactly_when_it_is_a_quantity_each_time_it_is_read(figure: str) -> None:
    """The figures' check is kept per text (model.dashboard._refusal): read
    twice, a figure is taken or refused as the quantity parser says, with its
    words."""
    from pydantic import ValidationError

    from hvfleet.model.quantity import Quantity

    try:
        Quantity.parse(figure)
        refusal = None
    except InvalidInput as exc:
        refusal = exc.detail
    for _ in range(2):
        try:
            HistoryPoint.model_validate({"t": 1, "v": {"cpu": [figure, "0", "8"]}})
            assert refusal is None
        except ValidationError as err:
            assert refusal is not None and f"v.cpu: {refusal}" in str(err)


@pytest.mark.parametrize(("tiers", "retention", "field", "words"), [
    ("10s", "7d", "history-tiers", "RESOLUTION:WINDOW"),
    ("10s:1h,5s:1d", "7d", "history-tiers", "finest"),
    ("1m:10s", "7d", "history-tiers", "shorter than the resolution"),
    ("10s:1h", "soon", "history-retention", "soon"),
    ("1s:7d", "7d", "history-tiers", "100,000"),
])
def test_bad_history_settings_name_the_option(tiers: str, retention: str, field: str, words: str) -> None:
    with pytest.raises(InvalidInput) as err:
        HistorySettings.parse(tiers, retention)
    assert err.value.field == field
    assert words in str(err.value)


def test_retention_cuts_every_window_and_ranges_pick_the_finest_tier_that_covers_them() -> None:
    s = HistorySettings.parse("10s:1h,1m:1d,10m:7d", "2d")
    assert [t.window for t in s.tiers] == [3600, 86_400, 2 * 86_400]
    assert s.tier_for(3600).name == "10s" and s.tier_for(86_400).name == "1m"
    assert s.tier_for(7 * 86_400).name == "10m"


# -- replicas over one store ------------------------------------------------------------------

def _host(name: str, used: int, role: str) -> Hypervisor:
    return Hypervisor.model_validate({
        "metadata": {"name": name, "labels": {"role": role}},
        "status": {"capacity": {"cpu": 16, "memory": "64Gi"}, "allocation": {"cpu": used, "memory": "4Gi"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })


@pytest.fixture(params=["sqlite", "etcd"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/hvfleet.db"
    else:
        cluster = request.getfixturevalue("etcd_session")
        yield cluster.url(prefix=f"/test-{uuid.uuid4().hex[:12]}")


def _replica(url: str, tiers: HistorySettings) -> tuple[Store, FleetState, HistoryKeeper]:
    store = open_store(url)
    state = FleetState(store)
    state.load()
    state.take_touched()  # as history.keep does after the first load
    keeper = HistoryKeeper(store, tiers)
    keeper.prime(group_figures(state))
    return store, state, keeper


def _follow(state: FleetState, store: Store) -> None:
    events = list(store.watch(since=state.revision, timeout=0.3))
    state.apply(events)


def test_a_series_in_the_store_writes_small_objects_drops_old_parts_and_reads_as_written(
        store_url: str) -> None:
    """write_point through a real store: the series' object never holds more
    than its share, parts before the window are deleted, a read from a moment
    on reads only the parts it needs and answers as the whole series does, and
    forget leaves nothing."""
    tier = Tier("10s", 10, 200)
    series = host_series("hv1")
    written: list[HistoryPoint] = []
    with open_store(store_url) as store:
        for i in range(40):
            point = _point(1_000_000 + 10 * i, i % 5 if i != 39 else 9)
            assert write_point(store, series, tier, point, part_points=4)
            written.append(point)
            assert not write_point(store, series, tier, point, part_points=4)  # that bucket is written
        names = [o.metadata.name for o in store.list("HistorySeries").items]
        head = store.get("HistorySeries", object_name(series, "10s"))
        assert len(head.spec.points) <= 4
        # 200 s back from the last point: the parts ending before are gone.
        assert all(p.last > written[-1].t - 200 - 40 for p in head.spec.parts)
        assert len(names) == 1 + len(head.spec.parts) <= 1 + 200 // 40 + 2
        everything = read_points(store, series, tier)
        assert everything[1:] == [p for p in written if p.t >= everything[1].t]
        assert everything[0].t <= written[-1].t - 200  # the value in force at the window's start
        since = written[-1].t - 45
        before = store.revision()
        recent = read_points(store, series, tier, since=since)
        assert recent[0].t <= since and recent[1:] == [p for p in written if p.t > recent[0].t]
        assert len(recent) < len(everything)
        assert store.revision() == before
        forget(store, series, (tier,))
        assert store.list("HistorySeries").items == []


def test_a_series_kept_whole_by_an_older_hvfleet_reads_as_it_is_and_moves_to_a_part(store_url: str) -> None:
    """Before parts, a series was one object of all its points: it is read as it
    is, and its next point moves them all to one part."""
    tier = Tier("10s", 10, 3600)
    old = [_point(1_000_000 + 10 * i, i % 3) for i in range(12)]
    name = object_name(FLEET, "10s")
    with open_store(store_url) as store:
        store.create(HistorySeries(metadata=ObjectMeta(name=name),
                                   spec=HistorySeriesSpec(series=FLEET, tier="10s", points=old)), MANAGER)
        assert read_points(store, FLEET, tier) == old
        new = _point(1_000_120, 7)
        assert write_point(store, FLEET, tier, new, part_points=4)
        head = store.get("HistorySeries", name)
        assert head.spec.points == [new] and head.spec.lead == old[-1]
        assert [(p.first, p.last) for p in head.spec.parts] == [(old[0].t, old[-1].t)]
        assert store.get("HistorySeries", part_name(name, old[0].t)).spec.points == old
        assert read_points(store, FLEET, tier) == [*old, new]


def test_replicas_sampling_one_bucket_write_it_once_and_read_the_same_series(store_url: str) -> None:
    tiers = HistorySettings.parse("10s:1h,1m:1d", "1d")
    with open_store(store_url) as setup:
        setup.create(_host("hv1", 2, "compute"), agent_manager("hv1"))
    a_store, a, keep_a = _replica(store_url, tiers)
    b_store, b, keep_b = _replica(store_url, tiers)
    try:
        now = 1_000_000.0
        first_a = sample_due(keep_a, a, now)
        first_b = sample_due(keep_b, b, now + 1)  # the same buckets, a second later
        assert first_a == 2 * 2  # fleet and role=compute, in both tiers
        assert first_b == 0
        with open_store(store_url) as agent:
            h = agent.get_hypervisor("hv1")
            agent.update(h.model_copy(update={"status": _host("hv1", 6, "compute").status}),
                         agent_manager("hv1"))
        _follow(a, a_store)
        _follow(b, b_store)
        later = now + 10
        written = sample_due(keep_a, a, later) + sample_due(keep_b, b, later + 2)
        # The 10 s tier moved on: the fleet, the label and the host, each once; the 1 min one did not.
        assert written == 3
        tier = tiers.tiers[0]
        for series in (FLEET, label_series("role", "compute"), host_series("hv1")):
            assert read_points(a_store, series, tier) == read_points(b_store, series, tier)
        fleet = read_points(a_store, FLEET, tier)
        assert [(p.t, p.v["cpu"][0]) for p in fleet] == [(1_000_000, "2"), (1_000_010, "6")]
        assert fleet[-1].v["memory"] == ["4Gi", "0", "64Gi"]
        # The 1 min tier's next bucket: the fleet, the label and the host moved.
        assert sample_due(keep_a, a, later + 20) == 3
        assert read_points(b_store, host_series("hv1"), tiers.tiers[1])[-1].v["cpu"][0] == "6"
        # A replica started now (or after a restart) writes nothing for an unchanged fleet.
        c_store, c, keep_c = _replica(store_url, tiers)
        try:
            assert sample_due(keep_c, c, later + 30) == 0
        finally:
            c_store.close()
    finally:
        a_store.close()
        b_store.close()


def test_one_replica_keeps_the_history_and_another_takes_it_over_when_its_turn_lapses(store_url: str) -> None:
    tiers = HistorySettings.parse("10s:1h", "1d")
    with open_store(store_url) as setup:
        setup.create(_host("hv1", 2, "compute"), agent_manager("hv1"))
    a_store, a, keep_a = _replica(store_url, tiers)
    b_store, b, keep_b = _replica(store_url, tiers)
    keep_a.turn, keep_b.turn = SamplerTurn(a_store, ttl=30), SamplerTurn(b_store, ttl=30)

    def agent_writes(used: int) -> None:
        with open_store(store_url) as agent:
            h = agent.get_hypervisor("hv1")
            agent.update(h.model_copy(update={"status": _host("hv1", used, "compute").status}),
                         agent_manager("hv1"))
        _follow(a, a_store)
        _follow(b, b_store)

    try:
        now = 1_000_000.0
        assert sample_due(keep_a, a, now) == 2  # the fleet and role=compute
        assert sample_due(keep_b, b, now + 1) == 0 and keep_b.holding is False
        agent_writes(6)
        assert sample_due(keep_a, a, now + 10) == 3  # and the host
        before = b._rows["hv1"]
        assert sample_due(keep_b, b, now + 11) == 0
        assert b._rows["hv1"] is before  # following cost it no row
        agent_writes(8)
        # a stops renewing (it died): once its turn lapsed, b keeps the history, and
        # samples the host changed while a had the turn.
        assert sample_due(keep_b, b, now + 35) == 0
        assert sample_due(keep_b, b, now + 41) == 3
        tier = tiers.tiers[0]
        host = read_points(a_store, host_series("hv1"), tier)
        assert [(p.t, p.v["cpu"][0]) for p in host] == [(1_000_010, "6"), (1_000_040, "8")]
        assert read_points(b_store, FLEET, tier)[-1].v["cpu"][0] == "8"
        # A clean stop hands the turn over at once.
        assert sample_due(keep_a, a, now + 50) == 0
        keep_b.turn.release()
        assert keep_a.holds(now + 51)
    finally:
        a_store.close()
        b_store.close()


def test_a_chart_has_axes_units_legend_and_a_data_table() -> None:
    points = [HistoryPoint(t=1_000_000, v={"cpu": ["2", "1", "16"], "memory": ["4Gi", "0", "64Gi"]}),
              HistoryPoint(t=1_001_800, v={"cpu": ["6", "0", "16"], "memory": ["8Gi", "2Gi", "64Gi"]})]
    doc = chart_document(FLEET, "hour", Tier("10s", 10, 3600), points, 1_003_000)
    built = {c.resource: c for c in charts.build(doc)}
    assert [t.text for t in built["memory"].y_ticks][:3] == ["0", "16Gi", "32Gi"]
    assert built["cpu"].latest == ["6", "0", "16"]
    assert len(built["cpu"].x_ticks) >= 5  # every 10 minutes of the hour
    html = charts.render(doc, "The fleet", lambda r: f"/history?range={r}", "t")
    assert "memory (bytes, binary units)" in html and "time (UTC)" in html
    assert "held by reservations" in html and "effective capacity" in html
    assert html.count("<table") == 2 and "8Gi" in html


@settings(max_examples=200, deadline=None)
@given(figure=st.integers(0, 10**30), resource=st.sampled_from(["cpu", "memory", "hugepages-1Gi", "VGPU"]))
def test_a_chart_has_a_handful_of_ticks_whatever_the_figures(figure: int, resource: str) -> None:
    """A host at the model's bounds (10**21 pages of 1 GiB: 10**30 bytes) once
    gave its chart 954,000 ticks: a 118 MB overview page for two hosts."""
    points = [HistoryPoint(t=1_000_000, v={resource: [str(figure), "0", str(figure)]})]
    doc = chart_document(FLEET, "hour", Tier("10s", 10, 3600), points, 1_003_000)
    (chart,) = charts.build(doc)
    assert 2 <= len(chart.y_ticks) <= 12
    ys = [t.at for t in chart.y_ticks]
    assert ys == sorted(ys, reverse=True)  # upwards, one tick per step


def test_serve_refuses_bad_history_options_naming_them(tmp_path: Path) -> None:
    import subprocess
    import sys

    hvfleet = str(Path(sys.executable).parent / "hvfleet")
    for option, value, words in (("--history-tiers", "bogus", "history-tiers: 'bogus'"),
                                 ("--history-retention", "soon", "history-retention: 'soon'")):
        out = subprocess.run([hvfleet, "serve", "--store", f"sqlite:///{tmp_path}/h.db", "--data-dir",
                              str(tmp_path / "data"), "--listen", "127.0.0.1:0", option, value],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        assert words in out.stderr and out.stdout == ""
        assert not (tmp_path / "h.db").exists() and not (tmp_path / "data").exists()  # nothing written


def test_the_dashboards_signing_key_is_one_for_every_replica_of_a_store(store_url: str) -> None:
    from hvfleet.server.dashboard.session import load_key

    with open_store(store_url) as a, open_store(store_url) as b:
        key = load_key(a)
        assert len(key) == 32 and load_key(b) == key == load_key(a)
