"""Commands on stored resources: get, describe, capacity, overcommit, reserved,
apply, export, delete, crd."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from hvfleet import views
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
from hvfleet.cli.output import OutputFormat, console, dump, emit, human, literal, print_table, table
from hvfleet.model import capacity as cap
from hvfleet.model.crd import crds
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy, Resource
from hvfleet.model.overcommit import matching_policies
from hvfleet.model.readiness import readiness
from hvfleet.model.resources import ResourceName
from hvfleet.model.spec_edits import SpecEdit, SpecMap
from hvfleet.model.spec_sync import spec_sync
from hvfleet.ops.apply import ApplyRequest
from hvfleet.ops.apply import apply as apply_manifests_op
from hvfleet.ops.spec import SpecEditRequest, edit_spec
from hvfleet.store import lifecycle
from hvfleet.store.apply import MAX_MANIFEST_BYTES, ClaimRequired
from hvfleet.store.base import fleet_kind_of, kind_of
from hvfleet.store.undecodable import Undecodable

OutputOpt = Annotated[OutputFormat, typer.Option("-o", "--output", help="table|wide|json|yaml")]


class GetOutput(StrEnum):
    """`get`'s forms: OutputFormat's, and kubectl's `name` (KIND.GROUP/NAME per line)."""

    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"
    name = "name"


GetOutputOpt = Annotated[GetOutput, typer.Option("-o", "--output", help="table|wide|json|yaml|name")]

overcommit_app = typer.Typer(help="Set or unset overcommit ratios (spec.overcommit).", no_args_is_help=True)
reserved_app = typer.Typer(help="Set or unset the host reserve (spec.reserved).", no_args_is_help=True)
extra_app = typer.Typer(help="Capacity libvirt cannot see (spec.extraCapacity).", no_args_is_help=True)
app.add_typer(overcommit_app, name="overcommit")
app.add_typer(reserved_app, name="reserved")
app.add_typer(extra_app, name="extra-capacity")


# -- get ------------------------------------------------------------------------------------

@app.command("get")
def get(
    kind: Annotated[str, typer.Argument(help="hypervisors | reservations | leases | overcommitpolicies")],
    name: Annotated[str | None, typer.Argument(help="One object by name.")] = None,
    selector: SelectorOpt = None,
    output: GetOutputOpt = GetOutput.table,
    store: StoreOpt = None,
) -> None:
    """List objects, or show one (kubectl get)."""
    k = fleet_kind_of(kind)
    unreadable: list[Undecodable] = []
    with connect(store) as s:
        if name:
            try:
                objs: list[Resource] = [s.get(k, name)]
            except Undecodable as exc:
                if output in (GetOutput.json, GetOutput.yaml):
                    raise
                objs, unreadable = [], [exc]
        else:
            listed = s.list(k, selector)
            objs, unreadable = listed.items, listed.undecodable
        inputs = views.table_inputs(k, s)
    for err in unreadable:  # skipped by the store; shown Unknown below
        print(f"warning: {err}", file=sys.stderr)
    if output in (GetOutput.json, GetOutput.yaml):
        emit(objs[0] if name else objs, output.value)
        return
    if output is GetOutput.name:
        names = sorted([o.metadata.name for o in objs] + [err.name for err in unreadable])
        sys.stdout.write("".join(f"{k.lower()}.hvfleet.io/{n}\n" for n in names))
        return
    cols, rows = views.rows_for(k, objs, inputs, datetime.now(UTC), output == GetOutput.wide)
    if unreadable:
        rows = sorted(rows + [views.unknown_row(cols, err.name) for err in unreadable],
                      key=lambda row: row[0])
    if not rows:
        print(views.TABLES[k].empty(), file=sys.stderr)
        return
    print_table([c.name for c in cols], rows)


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
        policies = s.list_overcommit_policies()
    now = datetime.now(UTC)
    m = h.metadata
    state = readiness(h, now, lease_live)
    console.print(f"[bold]Name:[/bold]        {literal(m.name)}")
    labels = ", ".join(f"{k}={v}" for k, v in m.labels.items()) or "-"
    console.print(f"[bold]Labels:[/bold]      {literal(labels)}")
    console.print(f"[bold]Created:[/bold]     {m.creation_timestamp}  (generation {m.generation}, "
                  f"observed {h.status.observed_generation})")
    console.print(f"[bold]Readiness:[/bold]   {state.state} ({literal(state.reason)}): "
                  f"{literal(state.message)}")
    synced = spec_sync(h, policies)
    console.print(f"[bold]Spec synced:[/bold] {synced.state}: {literal(synced.message)}")
    console.print(f"[bold]Heartbeat:[/bold]   {h.status.last_heartbeat_time or '-'}")
    maint: str = h.spec.maintenance or "-"
    if h.spec.maintenance_reason:
        maint += f" ({h.spec.maintenance_reason})"
    console.print(f"[bold]Maintenance:[/bold] {literal(maint)}")
    owners = "; ".join(dict.fromkeys(e.manager for e in m.managed_fields))
    console.print(f"[bold]Managers:[/bold]    {literal(owners or '-')}")
    matching = ", ".join(p.name for p in matching_policies(h, policies))
    console.print(f"[bold]Policies:[/bold]    {literal(matching or '-')}")
    console.print()
    console.print(table(
        [c.name for c in views.capacity_detail_columns()],
        views.capacity_detail_rows(h, [r for r in reservations if r.spec.hypervisor == h.name], now,
                                   policies),
        title="Capacity",
    ))
    if h.status.cells:
        console.print()
        console.print(table([c.name for c in views.cell_columns()], views.cell_rows(h, policies),
                            title="NUMA cells"))
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
        console.print(literal(f"  {i.name:<24} {i.uuid}  {i.state:<9} {res}"))


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
        policies = s.list_overcommit_policies()
    summary = views.fleet_summary(hvs, reservations, liveness, datetime.now(UTC), policies=policies)
    if output in (OutputFormat.json, OutputFormat.yaml):
        sys.stdout.write(dump(summary.to_dict(), output.value))
        return
    if not summary.hosts:
        print("No hypervisors found.", file=sys.stderr)
        return
    from rich.text import Text

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

TargetsArg = Annotated[
    list[str], typer.Argument(metavar="[NAME] RESOURCE=VALUE...",
                              help="NAME then RESOURCE=VALUE entries; with -l only the entries.")
]


def _targets(args: list[str], selector: str | None) -> tuple[str | None, list[str]]:
    """(host name or None for -l, the entries) from `NAME ENTRY...` or `-l SEL ENTRY...`."""
    if selector is None:
        if len(args) < 2:
            raise InvalidInput("give a hypervisor NAME and at least one entry, or -l SELECTOR")
        return args[0], args[1:]
    if not args:
        raise InvalidInput("give at least one entry")
    return None, args


def _edit(store_url: str | None, targets: list[str], selector: str | None, field: SpecMap,
          parse: Callable[[str], tuple[ResourceName, Any]] | None, manager: str,
          force: bool) -> None:
    """Set (with `parse`) or unset entries of spec map `field` on one host or on
    every host the selector matches (all or nothing), and print the result."""
    name, entries = _targets(targets, selector)
    if parse is not None:
        pairs = [parse(e) for e in entries]
        twice = sorted(r for r, n in Counter(r for r, _ in pairs).items() if n > 1)
        if twice:  # as `fit` refuses a resource requested twice
            raise InvalidInput(f"{twice[0]} is given twice", field=SPEC_FIELD[field])
        edit = SpecEdit(field, changes=dict(pairs))
    else:
        edit = SpecEdit(field, removals=[ResourceName.parse(e, where=SPEC_FIELD[field]) for e in entries])
    with connect(store_url) as s:
        # Generations as read before: a host whose generation did not move was
        # not changed (the edit said what it already had), and says so.
        before = {h.name: h.metadata.generation
                  for h in ([s.get_hypervisor(name)] if name is not None else s.list_hypervisors(selector))}
        answer = edit_spec(s, SpecEditRequest(edit, name, selector if name is None else None, force), manager)
        policies = s.list_overcommit_policies()
    for h in answer.hosts:
        _print_effective(h, policies, changed=before.get(h.name) != h.metadata.generation)


SPEC_FIELD: dict[SpecMap, str] = {
    "overcommit": "overcommit", "reserved": "reserved", "extra_capacity": "extraCapacity",
}


def _print_effective(h: Hypervisor, policies: Sequence[OvercommitPolicy], changed: bool) -> None:
    eff = cap.hypervisor_effective_capacity(h, policies)
    text = ", ".join(f"{r}={human(r, q)}" for r, q in sorted(eff.items())) or "-"
    console.print(f"hypervisor/{h.name} {'updated' if changed else 'unchanged'} "
                  f"(generation {h.metadata.generation}); effective capacity: {text}")


def _spec_map_commands(sub: typer.Typer, field: SpecMap, parse: Callable[[str], tuple[ResourceName, Any]],
                       set_help: str, unset_help: str) -> None:
    """`set` and `unset` of spec map `field` on one host or, with -l, on every
    matching host at once (all or nothing)."""

    @sub.command("set", help=set_help)
    def set_(
        targets: TargetsArg,
        selector: SelectorOpt = None,
        manager: ManagerOpt = DEFAULT_MANAGER,
        force: ForceOpt = False,
        store: StoreOpt = None,
    ) -> None:
        _edit(store, targets, selector, field, parse, manager, force)

    @sub.command("unset", help=unset_help)
    def unset(
        targets: Annotated[list[str], typer.Argument(
            metavar="[NAME] RESOURCE...", help="NAME then resources to reset; with -l only resources.")],
        selector: SelectorOpt = None,
        manager: ManagerOpt = DEFAULT_MANAGER,
        force: ForceOpt = False,
        store: StoreOpt = None,
    ) -> None:
        _edit(store, targets, selector, field, None, manager, force)


_spec_map_commands(
    overcommit_app, "overcommit", functools.partial(parse_ratio, where="overcommit"),
    "Set overcommit ratios (finite, > 0; below 1 keeps part of a resource free) on one host, or "
    "with -l on every matching host at once (all or nothing).",
    "Remove ratios (back to a matching OvercommitPolicy's, else 1.0).")


def _quantity_commands(sub: typer.Typer, field: SpecMap) -> None:
    label = SPEC_FIELD[field]
    _spec_map_commands(sub, field, functools.partial(parse_quantity_assignment, where=label),
                       f"Set {label} quantities on one host, or with -l on every matching host.",
                       f"Remove {label} entries.")


_quantity_commands(reserved_app, "reserved")
_quantity_commands(extra_app, "extra_capacity")


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
    request = ApplyRequest.from_text(text, filename, force)  # refused before the store is opened
    with connect(store) as s:
        try:
            answer = apply_manifests_op(s, request, manager)
        except ClaimRequired as exc:
            raise InvalidInput(f"{exc} (use `hvfleet reserve`)") from None
    for line in answer.lines():
        console.print(line)


def _pruned(values: dict[str, Any]) -> dict[str, Any]:
    """Without the entries left at their zero value, at any depth (an empty
    policy selector is the default, not something a person wrote)."""
    out = {}
    for k, v in values.items():
        if isinstance(v, dict):
            v = _pruned(v)
        if v not in ("", {}, [], None):
            out[k] = v
    return out


def manifest_of(obj: Resource) -> dict[str, Any]:
    """An object as a manifest: what a person wrote, not what the system filled in."""
    doc = obj.to_dict()
    meta = {"name": obj.metadata.name}
    if obj.metadata.labels:
        meta["labels"] = obj.metadata.labels  # type: ignore[assignment]
    if obj.metadata.annotations:
        meta["annotations"] = obj.metadata.annotations  # type: ignore[assignment]
    spec = _pruned(doc["spec"])
    out: dict[str, Any] = {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": meta,
                           "spec": spec}
    return out


@app.command("export")
def export(
    selector: SelectorOpt = None,
    kind: Annotated[
        str, typer.Option("--kind", help="hypervisors, reservations or overcommitpolicies")
    ] = "hypervisors",
    store: StoreOpt = None,
) -> None:
    """Print manifests (YAML) that `apply -f` turns back into the same objects."""
    with connect(store) as s:
        objs = s.list(fleet_kind_of(kind), selector).items
    import yaml

    sys.stdout.write(yaml.safe_dump_all([manifest_of(o) for o in objs], sort_keys=False))


@app.command("delete")
def delete(
    kind: Annotated[str, typer.Argument(help="hypervisor | reservation | overcommitpolicy")],
    name: Annotated[str, typer.Argument()],
    store: StoreOpt = None,
) -> None:
    """Delete one object (kubectl delete). A claim is better given back with
    `hvfleet release`, which keeps a record of it. An object with finalizers is
    only marked for deletion, and goes when the last one is removed."""
    k = kind_of(kind)
    with connect(store) as s:
        try:
            current = s.get(k, name)
        except Undecodable as exc:
            # Nothing of it can be read, finalizers included: deleting it, at the
            # version read, is how it is repaired.
            s.delete(k, name, str(exc.revision))
            console.print(f"{k.lower()}/{name} deleted")
            return
        now, gone = lifecycle.delete(s, current, DEFAULT_MANAGER)
    if gone:
        console.print(f"{k.lower()}/{name} deleted")
    else:
        waiting = ", ".join(now.metadata.finalizers or [])
        console.print(f"{k.lower()}/{name} marked for deletion, waiting for finalizers: {literal(waiting)}")


@app.command("crd")
def crd() -> None:
    """Print CustomResourceDefinitions for Hypervisor, Reservation and OvercommitPolicy."""
    import yaml

    sys.stdout.write(yaml.safe_dump_all(crds(), sort_keys=False))
