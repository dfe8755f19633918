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
from hvfleet.cli.output import OutputFormat, age, console, dump, emit, human, table
from hvfleet.model import capacity as cap
from hvfleet.model.crd import crds
from hvfleet.model.errors import InvalidInput, NotFound
from hvfleet.model.hypervisor import KINDS, Hypervisor, Reservation, Resource
from hvfleet.model.meta import API_VERSION, find_condition, validation_message
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import CPU, MEMORY, ResourceName
from hvfleet.store import Store
from hvfleet.store.base import fleet_kind_of, kind_of
from hvfleet.store.ownership import apply_spec

MAX_MANIFEST_BYTES = 4 * 1024 * 1024
LOW_FREE = 0.10  # highlight free capacity below 10% of effective

OutputOpt = Annotated[OutputFormat, typer.Option("-o", "--output", help="table|wide|json|yaml")]

overcommit_app = typer.Typer(help="Set or unset overcommit ratios (spec.overcommit).", no_args_is_help=True)
reserved_app = typer.Typer(help="Set or unset the host reserve (spec.reserved).", no_args_is_help=True)
extra_app = typer.Typer(help="Capacity libvirt cannot see (spec.extraCapacity).", no_args_is_help=True)
app.add_typer(overcommit_app, name="overcommit")
app.add_typer(reserved_app, name="reserved")
app.add_typer(extra_app, name="extra-capacity")


# -- readiness ----------------------------------------------------------------------------

def ready(h: Hypervisor, liveness: Mapping[str, bool] | None = None) -> str:
    """The Ready condition's status, or NotReady when the store says the host's
    agent let its liveness lease expire (etcd), whatever the last status says."""
    if liveness is not None and liveness.get(h.name) is False:
        return "NotReady"
    c = find_condition(h.status.conditions, "Ready")
    return c.status if c is not None else "Unknown"


# -- get ------------------------------------------------------------------------------------

def _hypervisor_rows(
    hvs: list[Hypervisor], wide: bool, liveness: Mapping[str, bool] | None = None
) -> tuple[list[str], list[list[str]]]:
    cols = ["NAME", "READY", "CPU", "MEMORY", "INSTANCES", "MAINTENANCE", "AGE"]
    if wide:
        cols += ["OVERCOMMIT", "RESERVED", "LABELS"]
    rows = []
    for h in hvs:
        eff = cap.hypervisor_effective_capacity(h)
        alloc = h.status.allocation
        row = [
            h.name,
            ready(h, liveness),
            f"{human(CPU, alloc.get(CPU, Quantity(0)))}/{human(CPU, eff.get(CPU))}",
            f"{human(MEMORY, alloc.get(MEMORY, Quantity(0)))}/{human(MEMORY, eff.get(MEMORY))}",
            str(len(h.status.instances)),
            h.spec.maintenance or "-",
            age(h.metadata.creation_timestamp),
        ]
        if wide:
            row += [
                ",".join(f"{r}={v:g}" for r, v in sorted(h.spec.overcommit.items())) or "-",
                ",".join(f"{r}={q}" for r, q in sorted(h.spec.reserved.items())) or "-",
                ",".join(f"{k}={v}" for k, v in sorted(h.metadata.labels.items())) or "-",
            ]
        rows.append(row)
    return cols, rows


def _reservation_rows(rs: list[Reservation]) -> tuple[list[str], list[list[str]]]:
    cols = ["NAME", "HYPERVISOR", "CONSUMER", "RESOURCES", "PHASE", "EXPIRES", "AGE"]
    rows = [
        [
            r.name, r.spec.hypervisor, r.spec.consumer,
            ",".join(f"{k}={human(k, q)}" for k, q in sorted(r.spec.resources.items())),
            r.status.phase,
            r.spec.expires_at.isoformat() if r.spec.expires_at else "-",
            age(r.metadata.creation_timestamp),
        ]
        for r in rs
    ]
    return cols, rows


@app.command("get")
def get(
    kind: Annotated[str, typer.Argument(help="hypervisors | reservations")],
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
    if output in (OutputFormat.json, OutputFormat.yaml):
        emit(objs[0] if name else objs, output.value)
        return
    if k == "Hypervisor":
        cols, rows = _hypervisor_rows([o for o in objs if isinstance(o, Hypervisor)],
                                      output == OutputFormat.wide, liveness)
    else:
        cols, rows = _reservation_rows([o for o in objs if isinstance(o, Reservation)])
    if not rows:
        print(f"No {k.lower()}s found.", file=sys.stderr)
        return
    console.print(table(cols, rows))


# -- describe --------------------------------------------------------------------------------

def capacity_rows(h: Hypervisor, reservations: list[Reservation]) -> list[list[str]]:
    eff = cap.hypervisor_effective_capacity(h)
    free = cap.free_capacity(h, reservations, datetime.now(UTC))
    mx = cap.max_unit(h)
    names = sorted(set(h.status.capacity) | set(h.spec.extra_capacity) | set(eff), key=str)
    rows = []
    for r in names:
        ratio = h.spec.overcommit.get(r)
        rows.append([
            str(r),
            human(r, h.status.capacity.get(r)),
            human(r, h.spec.extra_capacity.get(r)) if r in h.spec.extra_capacity else "-",
            human(r, h.spec.reserved.get(r)) if r in h.spec.reserved else "-",
            f"{ratio:g}" if ratio is not None else "1",
            human(r, eff.get(r)),
            human(r, h.status.allocation.get(r, Quantity(0))),
            human(r, free.get(r)),
            human(r, mx.get(r)),
        ])
    return rows


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
    m = h.metadata
    console.print(f"[bold]Name:[/bold]        {m.name}")
    console.print(f"[bold]Labels:[/bold]      {', '.join(f'{k}={v}' for k, v in m.labels.items()) or '-'}")
    console.print(f"[bold]Created:[/bold]     {m.creation_timestamp}  (generation {m.generation}, "
                  f"observed {h.status.observed_generation})")
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
        ["RESOURCE", "CAPACITY", "EXTRA", "RESERVED", "OVERCOMMIT", "EFFECTIVE", "ALLOCATED",
         "FREE", "MAX UNIT"],
        capacity_rows(h, reservations), title="Capacity",
    ))
    if h.status.cells:
        rows = []
        for c in h.status.cells:
            for r in sorted(c.capacity, key=str):
                rows.append([str(c.id), str(r), human(r, c.capacity.get(r)),
                             human(r, c.effective_capacity.get(r)),
                             human(r, c.allocation.get(r, Quantity(0)))])
        console.print()
        console.print(table(["CELL", "RESOURCE", "CAPACITY", "EFFECTIVE", "ALLOCATED"], rows,
                            title="NUMA cells"))
    if h.status.conditions:
        console.print()
        console.print(table(
            ["TYPE", "STATUS", "REASON", "MESSAGE", "SINCE"],
            [[c.type, c.status, c.reason, c.message, age(c.last_transition_time)]
             for c in h.status.conditions],
            title="Conditions",
        ))
    console.print()
    console.print(f"[bold]Instances:[/bold]   {len(h.status.instances)}")
    for i in h.status.instances:
        res = ", ".join(f"{k}={human(k, q)}" for k, q in sorted(i.resources.items()))
        console.print(f"  {i.name:<24} {i.uuid}  {i.state:<9} {res}")


# -- capacity -------------------------------------------------------------------------------

def _free_cell(r: ResourceName, free: Quantity | None, eff: Quantity | None) -> Text:
    if free is None:
        return Text("-")
    text = human(r, free)
    if free < 0:
        return Text(f"{text} (overcommitted)", style="bold red")
    if eff is not None and eff > 0 and free.value < eff.value * Quantity.parse("0.1").value:
        return Text(text, style="yellow")
    return Text(text)


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
    now = datetime.now(UTC)
    summary: list[dict[str, Any]] = []
    for h in hvs:
        eff = cap.hypervisor_effective_capacity(h)
        free = cap.free_capacity(h, reservations, now)
        summary.append({"name": h.name, "ready": ready(h, liveness), "effective": eff,
                        "allocation": dict(h.status.allocation), "free": free})
    total_eff = cap.add(x["effective"] for x in summary)
    total_alloc = cap.add(x["allocation"] for x in summary)
    total_free = cap.add(x["free"] for x in summary)
    if output in (OutputFormat.json, OutputFormat.yaml):
        def strs(d: dict[ResourceName, Quantity]) -> dict[str, str]:
            return {str(k): str(v) for k, v in sorted(d.items())}
        doc = {
            "hosts": [{"name": x["name"], "ready": x["ready"], "effective": strs(x["effective"]),
                       "allocation": strs(x["allocation"]), "free": strs(x["free"])}
                      for x in summary],
            "total": {"effective": strs(total_eff), "allocation": strs(total_alloc),
                      "free": strs(total_free)},
        }
        sys.stdout.write(dump(doc, output.value))
        return
    if not summary:
        print("No hypervisors found.", file=sys.stderr)
        return
    resources = sorted({r for x in summary for r in x["effective"]} | {CPU, MEMORY},
                       key=lambda r: (r not in (CPU, MEMORY), str(r)))
    t = table(["HOST", "READY"] + [f"{str(r).upper()} USED/EFFECTIVE" for r in resources]
              + [f"{str(r).upper()} FREE" for r in resources], [])
    rows = [*summary, {"name": "TOTAL", "ready": "", "effective": total_eff,
                       "allocation": total_alloc, "free": total_free}]
    for x in rows:
        cells: list[Text | str] = [Text(x["name"], style="bold" if x["name"] == "TOTAL" else ""),
                                   x["ready"]]
        for r in resources:
            cells.append(f"{human(r, x['allocation'].get(r, Quantity(0)))}/"
                         f"{human(r, x['effective'].get(r))}")
        for r in resources:
            cells.append(_free_cell(r, x["free"].get(r), x["effective"].get(r)))
        if x["name"] == "TOTAL":
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

def load_manifests(text: str, source: str) -> list[Resource]:
    """Parse and validate every document before anything is written."""
    if len(text.encode()) > MAX_MANIFEST_BYTES:
        raise InvalidInput(f"{source}: larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InvalidInput(f"{source}: malformed YAML{where}: {problem}") from None
    out: list[Resource] = []
    for i, doc in enumerate(docs, 1):
        what = f"{source}: document {i}"
        if not isinstance(doc, dict):
            raise InvalidInput(f"{what}: expected a mapping with apiVersion and kind")
        items = doc.get("items") if doc.get("kind") == "List" else [doc]
        for item in items or []:
            if not isinstance(item, dict):
                raise InvalidInput(f"{what}: list item is not a mapping")
            if item.get("apiVersion") != API_VERSION:
                raise InvalidInput(f"{what}: apiVersion: expected {API_VERSION!r}, "
                                   f"got {item.get('apiVersion')!r}")
            kind = item.get("kind")
            if kind not in KINDS:
                raise InvalidInput(f"{what}: kind: expected one of {', '.join(KINDS)}, got {kind!r}")
            name = (item.get("metadata") or {}).get("name", "?")
            try:
                out.append(KINDS[kind].model_validate(item))
            except ValidationError as exc:
                raise InvalidInput(validation_message(exc, f"{what} ({kind} {name})")) from None
    names = [(o.kind, o.metadata.name) for o in out]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        kind, name = sorted(dupes)[0]
        raise InvalidInput(f"{source}: {kind} {name} appears more than once")
    return out


def plan_apply(s: Store, manifests: list[Resource], manager: str) -> list[tuple[str, Resource]]:
    """What apply will write, checked against the current state before any write."""
    plan: list[tuple[str, Resource]] = []
    for m in manifests:
        try:
            current = s.get(m.kind, m.metadata.name)
        except NotFound:
            if isinstance(m, Reservation):
                # A new reservation must be claimed: only the claim re-checks free
                # capacity in the same atomic write, so apply must not bypass it.
                raise InvalidInput(
                    f"Reservation {m.metadata.name}: new reservations are claimed with "
                    "`hvfleet reserve`, which checks free capacity atomically"
                ) from None
            plan.append(("create", m))
            continue
        rv = m.metadata.resource_version or current.metadata.resource_version
        merged = apply_spec(current, m, manager)
        meta = merged.metadata.model_copy(update={
            "labels": m.metadata.labels, "annotations": m.metadata.annotations,
            "resource_version": rv,
        })
        merged = merged.model_copy(update={"metadata": meta})
        if isinstance(merged, Reservation) and isinstance(m, Reservation):
            merged = merged.model_copy(update={"status": m.status})
        plan.append(("update", merged))
    return plan


@app.command("apply")
def apply(
    filename: Annotated[str, typer.Option("-f", "--filename", help="YAML manifest file, or - for stdin.")],
    manager: ManagerOpt = DEFAULT_MANAGER,
    force: ForceOpt = False,
    store: StoreOpt = None,
) -> None:
    """Create or update objects from Kubernetes-style manifests (server-side apply)."""
    if filename == "-":
        text = sys.stdin.read(MAX_MANIFEST_BYTES + 1)
    else:
        try:
            text = Path(filename).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"{filename}: cannot read: {exc}") from None
    manifests = load_manifests(text, filename)
    with connect(store) as s:
        plan = plan_apply(s, manifests, manager)
        # Dry-run every update's ownership and version checks first, so one bad
        # document leaves the store untouched.
        from hvfleet.store.ownership import prepare_update

        for action, obj in plan:
            if action == "update":
                prepare_update(s.get(obj.kind, obj.metadata.name), obj, manager,
                               force=force, now=datetime.now(UTC))
        for action, obj in plan:
            if action == "create":
                s.create(obj, manager)
            else:
                s.update(obj, manager, force=force)
            console.print(f"{obj.kind.lower()}/{obj.metadata.name} "
                          f"{'created' if action == 'create' else 'configured'}")


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
