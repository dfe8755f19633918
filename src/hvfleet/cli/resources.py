"""Commands on stored resources: get, describe, capacity, overcommit, reserved,
apply, export, crd."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.text import Text

from hvfleet.cli.common import (
    DEFAULT_MANAGER,
    ForceOpt,
    ManagerOpt,
    SelectorOpt,
    StoreOpt,
    connect,
    parse_quantity_assignment,
    parse_ratio,
)
from hvfleet.cli.main import app
from hvfleet.cli.output import OutputFormat, console, dump, emit, human, table
from hvfleet.model import capacity as cap
from hvfleet.model import views
from hvfleet.model.crd import crds
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor, Reservation, Resource
from hvfleet.model.lease import Lease
from hvfleet.model.meta import validation_message
from hvfleet.model.readiness import readiness
from hvfleet.model.resources import ResourceName
from hvfleet.store.apply import MAX_MANIFEST_BYTES, ClaimRequired, apply_manifests, load_manifests
from hvfleet.store.base import fleet_kind_of, kind_of

OutputOpt = Annotated[OutputFormat, typer.Option("-o", "--output", help="table|wide|json|yaml")]

overcommit_app = typer.Typer(help="Set or unset overcommit ratios (spec.overcommit).", no_args_is_help=True)
reserved_app = typer.Typer(help="Set or unset the host reserve (spec.reserved).", no_args_is_help=True)
extra_app = typer.Typer(help="Capacity libvirt cannot see (spec.extraCapacity).", no_args_is_help=True)
app.add_typer(overcommit_app, name="overcommit")
app.add_typer(reserved_app, name="reserved")
app.add_typer(extra_app, name="extra-capacity")


# -- get ------------------------------------------------------------------------------------

@app.command("get")
def get(
    kind: Annotated[str, typer.Argument(help="hypervisors | reservations | leases")],
    name: Annotated[str | None, typer.Argument(help="One object by name.")] = None,
    selector: SelectorOpt = None,
    output: OutputOpt = OutputFormat.table,
    store: StoreOpt = None,
) -> None:
    """List objects, or show one (kubectl get)."""
    k = fleet_kind_of(kind)
    with connect(store) as s:
        objs: list[Resource] = [s.get(k, name)] if name else s.list(k, selector).items
        liveness = s.agent_liveness() if k == "Hypervisor" else {}
        hosts = {h.name: h for h in s.list_hypervisors()} if k == "Reservation" else {}
    if output in (OutputFormat.json, OutputFormat.yaml):
        emit(objs[0] if name else objs, output.value)
        return
    now = datetime.now(UTC)
    wide = output == OutputFormat.wide
    if k == "Hypervisor":
        cols = views.hypervisor_columns(wide)
        rows = [views.hypervisor_row(o, now, liveness.get(o.name), wide)
                for o in objs if isinstance(o, Hypervisor)]
    elif k == "Lease":
        cols = views.lease_columns(wide)
        rows = [views.lease_row(o, now, wide) for o in objs if isinstance(o, Lease)]
    else:
        cols = views.reservation_columns(wide)
        rows = [views.reservation_row(o, hosts.get(o.spec.hypervisor), now, wide)
                for o in objs if isinstance(o, Reservation)]
    if not rows:
        print(f"No {k.lower()}s found.", file=sys.stderr)
        return
    console.print(table([c.name for c in cols], rows))


# -- describe --------------------------------------------------------------------------------

@app.command("describe")
def describe(
    kind: Annotated[str, typer.Argument(help="hypervisor")],
    name: Annotated[str, typer.Argument()],
    store: StoreOpt = None,
) -> None:
    """Capacity, cells, conditions and instances of one hypervisor."""
    if kind_of(kind) != "Hypervisor":
        raise InvalidInput(f"describe: only hypervisors can be described, not {kind!r}")
    with connect(store) as s:
        h = s.get_hypervisor(name)
        reservations = s.list_reservations()
        lease_live = s.agent_liveness().get(name)
    now = datetime.now(UTC)
    m = h.metadata
    state = readiness(h, now, lease_live)
    console.print(f"[bold]Name:[/bold]        {m.name}")
    console.print(f"[bold]Labels:[/bold]      {', '.join(f'{k}={v}' for k, v in m.labels.items()) or '-'}")
    console.print(f"[bold]Created:[/bold]     {m.creation_timestamp}  (generation {m.generation}, "
                  f"observed {h.status.observed_generation})")
    console.print(f"[bold]Readiness:[/bold]   {state.state} ({state.reason}): {state.message}")
    synced = views.spec_sync(h)
    console.print(f"[bold]Spec synced:[/bold] {synced.state}: {synced.message}")
    console.print(f"[bold]Heartbeat:[/bold]   {h.status.last_heartbeat_time or '-'}")
    maint: str = h.spec.maintenance or "-"
    if h.spec.maintenance_reason:
        maint += f" ({h.spec.maintenance_reason})"
    console.print(f"[bold]Maintenance:[/bold] {maint}")
    owners = "; ".join(
        f"{e.manager}" for e in m.managed_fields
    )
    console.print(f"[bold]Managers:[/bold]    {owners or '-'}")
    console.print()
    console.print(table(
        [c.name for c in views.capacity_detail_columns()],
        views.capacity_detail_rows(h, [r for r in reservations if r.spec.hypervisor == h.name], now),
        title="Capacity",
    ))
    if h.status.cells:
        console.print()
        console.print(table([c.name for c in views.cell_columns()], views.cell_rows(h), title="NUMA cells"))
    if h.status.conditions:
        console.print()
        console.print(table(
            ["TYPE", "STATUS", "REASON", "MESSAGE", "SINCE"],
            [[c.type, c.status, c.reason, c.message, views.age(c.last_transition_time, now)]
             for c in h.status.conditions],
            title="Conditions",
        ))
    console.print()
    console.print(f"[bold]Instances:[/bold]   {len(h.status.instances)}")
    for i in h.status.instances:
        res = ", ".join(f"{k}={human(k, q)}" for k, q in sorted(i.resources.items()))
        console.print(f"  {i.name:<24} {i.uuid}  {i.state:<9} {res}")


# -- capacity -------------------------------------------------------------------------------

_LEVEL_STYLE = {"ok": "", "low": "yellow", "overcommitted": "bold red"}


@app.command("capacity")
def capacity(
    selector: SelectorOpt = None,
    output: OutputOpt = OutputFormat.table,
    store: StoreOpt = None,
) -> None:
    """Effective, allocated and free capacity per host, with a total row."""
    with connect(store) as s:
        hvs = s.list_hypervisors(selector)
        reservations = s.list_reservations()
        liveness = s.agent_liveness()
    summary = views.fleet_summary(hvs, reservations, liveness, datetime.now(UTC))
    if output in (OutputFormat.json, OutputFormat.yaml):
        sys.stdout.write(dump(summary.to_dict(), output.value))
        return
    if not summary.hosts:
        print("No hypervisors found.", file=sys.stderr)
        return
    t = table([c.name for c in views.capacity_columns(summary)], [])
    for row in views.capacity_rows(summary):
        cells = [Text(text, style=_LEVEL_STYLE[level])
                 for text, level in zip(row.cells, row.levels, strict=True)]
        if row.total:
            cells[0].stylize("bold")
            t.add_section()
        t.add_row(*cells)
    console.print(t)


# -- spec edits -----------------------------------------------------------------------------------

NameArg = Annotated[str, typer.Argument(help="Hypervisor name.")]


def _edit_spec(store_url: str | None, name: str, field: str, changes: Mapping[ResourceName, Any],
               removals: list[str], manager: str, force: bool) -> Hypervisor:
    def mutate(h: Hypervisor) -> Hypervisor:
        values = dict(getattr(h.spec, field))
        values.update(changes)
        for r in removals:
            values.pop(r, None)
        try:
            spec = h.spec.model_validate({**h.spec.model_dump(), field: values})
        except ValidationError as exc:
            raise InvalidInput(validation_message(exc, f"hypervisor {name}: spec")) from None
        return h.model_copy(update={"spec": spec})

    with connect(store_url) as s:
        return s.update_hypervisor(name, mutate, manager, force=force)


def _print_effective(h: Hypervisor) -> None:
    eff = cap.hypervisor_effective_capacity(h)
    text = ", ".join(f"{r}={human(r, q)}" for r, q in sorted(eff.items())) or "-"
    console.print(f"hypervisor/{h.name} updated (generation {h.metadata.generation}); "
                  f"effective capacity: {text}")


@overcommit_app.command("set")
def overcommit_set(
    name: NameArg,
    ratios: Annotated[list[str], typer.Argument(help="RESOURCE=RATIO, e.g. cpu=4 memory=1.5")],
    manager: ManagerOpt = DEFAULT_MANAGER,
    force: ForceOpt = False,
    store: StoreOpt = None,
) -> None:
    """Set overcommit ratios (finite, > 0; below 1 keeps part of a resource free)."""
    changes = dict(parse_ratio(r, "overcommit") for r in ratios)
    _print_effective(_edit_spec(store, name, "overcommit", changes, [], manager, force))


@overcommit_app.command("unset")
def overcommit_unset(
    name: NameArg,
    resources: Annotated[list[str], typer.Argument(help="Resources to reset to ratio 1.")],
    manager: ManagerOpt = DEFAULT_MANAGER,
    force: ForceOpt = False,
    store: StoreOpt = None,
) -> None:
    """Remove ratios (back to 1.0)."""
    names = [str(ResourceName.parse(r, where="overcommit")) for r in resources]
    _print_effective(_edit_spec(store, name, "overcommit", {}, names, manager, force))


def _quantity_commands(sub: typer.Typer, field: str, label: str) -> None:
    @sub.command("set")
    def set_(
        name: NameArg,
        values: Annotated[list[str], typer.Argument(help="RESOURCE=QUANTITY, e.g. memory=4Gi")],
        manager: ManagerOpt = DEFAULT_MANAGER,
        force: ForceOpt = False,
        store: StoreOpt = None,
    ) -> None:
        changes = dict(parse_quantity_assignment(v, label) for v in values)
        _print_effective(_edit_spec(store, name, field, changes, [], manager, force))

    set_.__doc__ = f"Set {label} quantities."

    @sub.command("unset")
    def unset(
        name: NameArg,
        resources: Annotated[list[str], typer.Argument()],
        manager: ManagerOpt = DEFAULT_MANAGER,
        force: ForceOpt = False,
        store: StoreOpt = None,
    ) -> None:
        names = [str(ResourceName.parse(r, where=label)) for r in resources]
        _print_effective(_edit_spec(store, name, field, {}, names, manager, force))

    unset.__doc__ = f"Remove {label} entries."


_quantity_commands(reserved_app, "reserved", "reserved")
_quantity_commands(extra_app, "extra_capacity", "extraCapacity")


# -- apply / export / crd -------------------------------------------------------------------------

@app.command("apply")
def apply(
    filename: Annotated[str, typer.Option("-f", "--filename", help="YAML manifest file, or - for stdin.")],
    manager: ManagerOpt = DEFAULT_MANAGER,
    force: ForceOpt = False,
    store: StoreOpt = None,
) -> None:
    """Create or update objects from Kubernetes-style manifests (server-side apply),
    all or nothing."""
    if filename == "-":
        text = sys.stdin.read(MAX_MANIFEST_BYTES + 1)
    else:
        try:
            text = Path(filename).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"{filename}: cannot read: {exc}") from None
    manifests = load_manifests(text, filename)
    with connect(store) as s:
        try:
            applied = apply_manifests(s, manifests, manager, force=force)
        except ClaimRequired as exc:
            raise InvalidInput(f"{exc} (use `hvfleet reserve`)") from None
    for a in applied:
        console.print(f"{a.object.kind.lower()}/{a.object.metadata.name} {a.action}")


def manifest_of(obj: Resource) -> dict[str, Any]:
    """An object as a manifest: what a person wrote, not what the system filled in."""
    doc = obj.to_dict()
    meta = {"name": obj.metadata.name}
    if obj.metadata.labels:
        meta["labels"] = obj.metadata.labels  # type: ignore[assignment]
    if obj.metadata.annotations:
        meta["annotations"] = obj.metadata.annotations  # type: ignore[assignment]
    spec = {k: v for k, v in doc["spec"].items() if v not in ("", {}, [], None)}
    out: dict[str, Any] = {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": meta,
                           "spec": spec}
    return out


@app.command("export")
def export(
    selector: SelectorOpt = None,
    kind: Annotated[str, typer.Option("--kind", help="hypervisors or reservations")] = "hypervisors",
    store: StoreOpt = None,
) -> None:
    """Print manifests (YAML) that `apply -f` turns back into the same objects."""
    with connect(store) as s:
        objs = s.list(fleet_kind_of(kind), selector).items
    sys.stdout.write(yaml.safe_dump_all([manifest_of(o) for o in objs], sort_keys=False))


@app.command("crd")
def crd() -> None:
    """Print CustomResourceDefinitions for Hypervisor and Reservation."""
    sys.stdout.write(yaml.safe_dump_all(crds(), sort_keys=False))
