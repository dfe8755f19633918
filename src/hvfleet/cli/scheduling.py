"""`hvfleet fit`, `reserve`, `release`, `reservations [gc]`, `placement export|sync`.

Thin: each command parses its options, opens the store, calls
`hvfleet.scheduling` and prints. Exit codes: 2 bad input, 3 does not fit
(a scheduler should try elsewhere), 1 other failures.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hvfleet import views as model_views
from hvfleet.cli.common import SelectorOpt, StoreOpt, consumer_uuid
from hvfleet.cli.main import app
from hvfleet.cli.output import dump, print_table, shown
from hvfleet.model.durations import parse_duration
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import HOLDING_PHASES, Hypervisor
from hvfleet.model.readiness import DEFAULT_STALENESS
from hvfleet.model.selectors import parse_selector
from hvfleet.ops.claims import ClaimQuery, claim
from hvfleet.ops.claims import release as ops_release
from hvfleet.ops.fit import FitQuery, fit, resource_pairs
from hvfleet.ops.placement import PlacementQuery, export
from hvfleet.scheduling.claims import MANAGER, derive_phases, gc
from hvfleet.scheduling.placement_push import PushIdentity
from hvfleet.store import open_store

if TYPE_CHECKING:
    # Imported by the commands that use them: numpy comes with the index,
    # an HTTP client with Placement; `reservations` and `release` need neither.
    pass


class Weigher(StrEnum):
    binpack = "binpack"
    spread = "spread"


class Output(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


CpuOpt = Annotated[str | None, typer.Option("--cpu", help="vCPUs per instance.")]
MemOpt = Annotated[str | None, typer.Option("--memory", help="Memory per instance, e.g. 4Gi.")]
ResOpt = Annotated[
    list[str] | None,
    typer.Option("--resource", help="NAME=QUANTITY, e.g. VGPU=1 (repeatable)."),
]
OutOpt = Annotated[Output, typer.Option("-o", "--output")]
WeigherOpt = Annotated[Weigher, typer.Option("--weigher", help="binpack or spread.")]
StalenessOpt = Annotated[
    str,
    typer.Option("--staleness", help="Hosts whose heartbeat is older are not candidates (3 × resync)."),
]


def _staleness(text: str) -> timedelta:
    return parse_duration(text, field="staleness", positive=True)


def _print_doc(data: Any, output: Output = Output.json) -> None:
    sys.stdout.write(dump(data, output.value))


def _table(rows: list[list[str]]) -> None:
    """rows[0] is the header, as everywhere else in the CLI (hvfleet.cli.output)."""
    if rows:
        print_table(rows[0], rows[1:])


@app.command("fit")
def fit_command(
    cpu: CpuOpt = None,
    memory: MemOpt = None,
    resource: ResOpt = None,
    count: Annotated[int, typer.Option("--count", help="Instances on one host.")] = 1,
    selector: SelectorOpt = None,
    weigher: WeigherOpt = Weigher.binpack,
    limit: Annotated[int | None, typer.Option("--limit", help="At most M hosts.")] = None,
    output: OutOpt = Output.table,
    why: Annotated[bool, typer.Option("--why", help="Say why each other host is rejected.")] = False,
    staleness: StalenessOpt = f"{int(DEFAULT_STALENESS.total_seconds())}s",
    store: StoreOpt = None,
) -> None:
    """Hosts a request fits on, best first. Exits 3 when none does."""
    from hvfleet.scheduling.index import FleetIndex

    query = FitQuery.from_plain({
        "cpu": cpu, "memory": memory, "resources": resource_pairs(resource or []), "count": count,
        "labelSelector": selector or "", "weigher": weigher.value, "limit": limit, "why": why,
    })
    query.request()  # bad input is refused before the store is opened
    with open_store(store) as st:
        index = FleetIndex.from_store(st, _staleness(staleness))
    answer = fit(index, query)
    if output is not Output.table:
        _print_doc(answer.document(), output)
    else:
        if answer.fits:
            _table(answer.table())
        for c in answer.candidates:
            if c.synced.state == "False":
                print(f"{c.name}: SYNCED False: {c.synced.message}", file=sys.stderr)
        if why and answer.rejected:
            for name, found in answer.rejected.items():
                print(shown(f"{name}: " + "; ".join(r.message for r in found)))
    if not answer.fits:
        raise answer.nothing_fits()


@app.command("reserve")
def reserve_command(
    host: Annotated[str | None, typer.Argument(help="The host to claim on (or --auto).")] = None,
    cpu: CpuOpt = None,
    memory: MemOpt = None,
    resource: ResOpt = None,
    consumer: Annotated[str, typer.Option(
        "--consumer", help="The UUID of the instance the space is for (Placement's consumer).")] = "",
    ttl: Annotated[str, typer.Option("--ttl", help="Expire after (0: never).")] = "10m",
    auto: Annotated[bool, typer.Option("--auto", help="Pick the best host and claim it.")] = False,
    count: Annotated[int, typer.Option("--count", help="Instances on one host.")] = 1,
    selector: SelectorOpt = None,
    weigher: WeigherOpt = Weigher.binpack,
    staleness: StalenessOpt = f"{int(DEFAULT_STALENESS.total_seconds())}s",
    store: StoreOpt = None,
) -> None:
    """Take space on a host before the VM exists; prints the reservation name.
    Exits 3 when it does not fit (any more)."""
    consumer = consumer_uuid(consumer)
    if auto == (host is not None):
        raise InvalidInput("reserve: give either HOST or --auto")
    if selector is not None and not auto:
        raise InvalidInput("-l/--selector: only with --auto")
    query = ClaimQuery.from_plain({
        "host": host, "auto": auto, "cpu": cpu, "memory": memory,
        "resources": resource_pairs(resource or []), "count": count, "consumer": consumer, "ttl": ttl,
        "labelSelector": selector, "weigher": weigher.value,
    })
    query.check()
    stale = _staleness(staleness)
    with open_store(store) as st:
        made = claim(st, query, MANAGER, stale).reservation
    print(made.name)


@app.command("release")
def release_command(name: Annotated[str, typer.Argument()], store: StoreOpt = None) -> None:
    """Give a reservation's space back."""
    with open_store(store) as st:
        out = ops_release(st, name, MANAGER)
    print(f"{out.name} {out.status.phase}")


reservations_app = typer.Typer(help="List reservations; `gc` removes ended ones.")
app.add_typer(reservations_app, name="reservations")


def _reservation_rows(views: list[Any], hosts: dict[str, Hypervisor], output: Output) -> None:
    if output is not Output.table:
        items = []
        for v in views:
            d = v.reservation.to_dict()
            d["status"]["phase"] = v.phase
            items.append(d)
        _print_doc({"items": items}, output)
        return
    now = datetime.now(UTC)
    cols = model_views.reservation_columns(wide=True)
    rows = [[c.name for c in cols]]
    for v in views:
        r = v.reservation
        rows.append(model_views.reservation_row(r, hosts.get(r.spec.hypervisor), now, wide=True))
    _table(rows)


@reservations_app.callback(invoke_without_command=True)
def reservations_command(
    ctx: typer.Context,
    selector: Annotated[str | None, typer.Option(
        "-l", "--selector",
        help="Select by the reservation's own labels, e.g. hvfleet.io/hypervisor=compute-01.")] = None,
    hypervisor_selector: Annotated[str | None, typer.Option(
        "--hypervisor-selector",
        help="Select by the labels of the host a reservation is on, e.g. role=compute.")] = None,
    output: OutOpt = Output.table,
    store: StoreOpt = None,
) -> None:
    """List reservations with their phase derived now (Confirmed, Expired, ...)."""
    if ctx.invoked_subcommand is not None:
        return
    on = parse_selector(hypervisor_selector)
    with open_store(store) as st:
        hosts = {h.name: h for h in st.list_hypervisors()}
        listed = st.list_reservations(parse_selector(selector))
        # Only a host selector asks for hosts that exist: a claim on a deleted
        # host stays in the store and holds again when the host registers again.
        if on.requirements:
            chosen = {h.name for h in st.list_hypervisors(on)}
            listed = [r for r in listed if r.spec.hypervisor in chosen]
        views = derive_phases(listed, hosts.values(), datetime.now(UTC))
    for v in views:
        r = v.reservation
        if r.spec.hypervisor not in hosts and v.phase in HOLDING_PHASES:
            print(f"warning: reservation {r.name} is on hypervisor {r.spec.hypervisor}, which does "
                  "not exist (it holds its space there if the host registers again)", file=sys.stderr)
    _reservation_rows(views, hosts, output)


@reservations_app.command("gc")
def reservations_gc_command(output: OutOpt = Output.table, store: StoreOpt = None) -> None:
    """Delete reservations that ended: Confirmed, Released or Expired."""
    with open_store(store) as st:
        removed = gc(st)
    if output is not Output.table:
        deleted = [{"name": v.reservation.name, "phase": v.phase} for v in removed]
        _print_doc({"deleted": deleted}, output)
    else:
        for v in removed:
            print(f"{v.reservation.name} {v.phase} deleted")


placement_app = typer.Typer(help="The Placement-compatible view, and mirroring Placement.")
app.add_typer(placement_app, name="placement")


@placement_app.command("export")
def placement_export_command(
    selector: SelectorOpt = None,
    output: Annotated[str, typer.Option("-o", "--output", help="json")] = "json",
    store: StoreOpt = None,
) -> None:
    """Per hypervisor a resource provider: inventories exactly as Placement
    expects them, and current usages."""
    if output != "json":
        raise InvalidInput(f"-o: {output!r} is not supported here (json)")
    query = PlacementQuery.from_plain({"labelSelector": selector})
    with open_store(store) as st:
        doc = export(st, query)
    for left in doc.get("skipped", []):
        print(f"warning: hypervisor {left['name']} left out: {left['reason']}", file=sys.stderr)
    for gone in doc.get("omitted", []):
        print(f"warning: hypervisor {gone['name']}: {gone['reason']}", file=sys.stderr)
    _print_doc(doc)


@placement_app.command("sync")
def placement_sync_command(
    url: Annotated[str, typer.Option("--url", help="Placement endpoint.")],
    token: Annotated[str, typer.Option(
        "--token", envvar="OS_TOKEN",
        help="Placement's token (sent as X-Auth-Token to --url), not hvfleet's: an https:// "
        "store's token is $HVFLEET_TOKEN or the kubeconfig's here.")] = "admin",
    inventories: Annotated[
        bool,
        typer.Option(
            "--push-inventories/--no-push-inventories",
            help="Write hvfleet's inventories (overcommit, reserve, max_unit) to its providers.",
        ),
    ] = True,
    push_claims: Annotated[
        bool, typer.Option("--push-claims", help="Make hvfleet's live claims Placement allocations.")
    ] = False,
    project_id: Annotated[
        str, typer.Option("--project-id", help="Project id hvfleet's allocations are written under.")
    ] = PushIdentity.project_id,
    user_id: Annotated[
        str, typer.Option("--user-id", help="User id hvfleet's allocations are written under.")
    ] = PushIdentity.user_id,
    output: OutOpt = Output.table,
    store: StoreOpt = None,
) -> None:
    """Push inventories (and claims) to Placement, and keep one Reservation per
    Placement consumer per host until libvirt shows it. Exits 1 if a push failed."""
    from hvfleet.scheduling.placement import sync
    from hvfleet.scheduling.placement_client import PlacementClient

    with open_store(store) as st, PlacementClient(url, token) as client:
        report = sync(
            st,
            client,
            push_inventories=inventories,
            push_claims=push_claims,
            identity=PushIdentity(project_id, user_id),
        )
    if output is not Output.table:
        _print_doc(report.to_dict(), output)
    else:
        print(
            f"mirrors: created {len(report.created)}, updated {len(report.updated)}, "
            f"deleted {len(report.deleted)}, unchanged {report.unchanged}"
        )
        if report.resource_classes is not None:
            rc = report.resource_classes
            print(f"resource classes: created {len(rc['created'])}, existing {rc['existing']}")
        if report.inventories is not None:
            inv = report.inventories
            print(f"inventories: updated {len(inv['updated'])}, unchanged {inv['unchanged']}")
        if report.claims is not None:
            c = report.claims
            print(
                f"allocations: created {len(c['created'])}, updated {len(c['updated'])}, "
                f"deleted {len(c['deleted'])}, unchanged {c['unchanged']}"
            )
        for name in report.unknown_providers:
            print(f"provider {name}: no hypervisor of that name", file=sys.stderr)
    for message in report.errors:
        print(message, file=sys.stderr)
    if report.errors:
        raise typer.Exit(1)
