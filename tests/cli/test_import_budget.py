"""Start-up budget of the `hvfleet` command: each command, run as a fresh
process on a SQLite store with a real host in it, imports no heavy module it
does not need (numpy only for the fleet index, libvirt only for the agent, the
etcd client only for etcd stores, the guest generator only for guest
commands, ...); and `hvfleet --help`, built from `COMMANDS`, says what the
command modules themselves register."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FLEET = Path(__file__).parents[2] / "examples" / "fleet"

# Heavy modules, each with what may pull it in.
HEAVY = {
    "numpy": "the fleet index (fit, reserve --auto)",
    "libvirt": "the agent, and `guest check` (libvirt's own parser judges the definition)",
    "prometheus_client": "the agent's metrics",
    "etcd3gw": "etcd stores",
    "lxml": "libvirt XML: the agent, guest and cpu commands",
    "hvfleet.guests.generate": "guest commands",
    "hvfleet.guests.osinfo": "guest commands",
    "pydantic": "commands that read or write objects",
    "rich": "tables",
    "yaml": "-o yaml, apply, export",
    "http.client": "Placement (placement export/sync)",
}

# command → the heavy modules it may import; every other one is over budget.
BUDGET: list[tuple[list[str], set[str]]] = [
    (["--help"], set()),
    (["--store-prefix", "/x", "--help"], set()),
    (["get", "--help"], {"pydantic"}),
    (["get", "hypervisors"], {"pydantic", "rich"}),
    (["get", "hypervisors", "-o", "json"], {"pydantic"}),
    (["get", "hypervisors", "-o", "yaml"], {"pydantic", "yaml"}),
    (["get", "reservations"], {"pydantic", "rich"}),
    (["get", "leases"], {"pydantic", "rich"}),
    (["get", "overcommitpolicies"], {"pydantic", "rich"}),
    (["placement", "export"], {"pydantic"}),
    (["overcommit", "set", "--help"], {"pydantic"}),
    (["token", "list"], {"pydantic", "rich"}),
    (["serve", "--help"], {"pydantic"}),
    (["kubeconfig", "--help"], {"pydantic", "yaml"}),  # it writes YAML
    (["capacity"], {"pydantic", "rich"}),
    (["capacity", "-o", "json"], {"pydantic"}),
    (["describe", "hypervisor", "edge-01"], {"pydantic", "rich"}),
    (["export"], {"pydantic", "yaml"}),
    (["fit", "--cpu", "1"], {"numpy", "pydantic", "rich"}),
    (["fit", "--cpu", "1", "-o", "json"], {"numpy", "pydantic"}),
    (["reservations"], {"pydantic", "rich"}),
    (["guest", "policies"], {"lxml", "hvfleet.guests.generate", "hvfleet.guests.osinfo", "pydantic"}),
    (["agent", "--help"], {"libvirt", "prometheus_client", "lxml", "pydantic", "http.client"}),
]

_PROBE = """
import contextlib, io, json, sys
from hvfleet.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
        code = 0
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('budget')}/hvfleet.db"
    subprocess.run([sys.executable, "-m", "hvfleet", "agent", "--connect", f"test://{FLEET / 'edge-01.xml'}",
                    "--store", url, "--once"], check=True, capture_output=True, timeout=120)
    return url


def imported(args: list[str], store: str) -> tuple[int, set[str]]:
    out = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "HVFLEET_STORE": store})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return doc["code"], set(doc["modules"])


def _id(value: object) -> str | None:
    return " ".join(value) if isinstance(value, list) else None


@pytest.mark.parametrize(("args", "allowed"), BUDGET, ids=_id)
def test_a_command_imports_only_the_heavy_modules_it_needs(
    store: str, args: list[str], allowed: set[str]
) -> None:
    code, modules = imported(args, store)
    assert code in (0, None), f"hvfleet {' '.join(args)} exited {code}"
    over = {m: why for m, why in HEAVY.items() if m not in allowed and m in modules}
    assert not over, f"hvfleet {' '.join(args)} imports {over}"


def test_the_probe_sees_heavy_imports(store: str) -> None:
    # The budget could pass vacuously if the probe missed imports: fit does use numpy.
    code, modules = imported(["fit", "--cpu", "1"], store)
    assert code in (0, None) and "numpy" in modules and "hvfleet.cli.scheduling" in modules


_REGISTERED = """
import importlib, json, pkgutil
import typer.main
import hvfleet.cli
from hvfleet.cli import main as m
seen, owner = set(), {}
for info in pkgutil.iter_modules(hvfleet.cli.__path__):
    if info.name in m._NOT_COMMANDS or info.name.startswith("_"):
        continue
    importlib.import_module(f"hvfleet.cli.{info.name}")
    names = {c.name for c in m.app.registered_commands} | {g.name for g in m.app.registered_groups}
    for n in names - seen:
        owner[n] = info.name
    seen |= names
group = typer.main.get_group(m.app)
listing = typer.main.get_group(m._listing())
print(json.dumps({n: [owner[n], c.get_short_help_str(limit=1000),
                      listing.commands[n].get_short_help_str(limit=1000) if n in listing.commands else None]
                  for n, c in group.commands.items()}))
"""


def test_the_help_table_is_what_the_command_modules_register() -> None:
    from hvfleet.cli.main import COMMANDS

    out = subprocess.run([sys.executable, "-c", _REGISTERED], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    real = json.loads(out.stdout)
    want = {name: (module, help_line) for name, (module, help_line, _listed) in real.items()}
    wrong = {name: row for name, row in want.items() if COMMANDS.get(name) != row}
    missing = set(COMMANDS) - set(want)
    assert not wrong and not missing, (
        f"cli/main.py COMMANDS: set these rows {wrong}, drop {sorted(missing)}")
    assert all(listed == help_line for _module, help_line, listed in real.values())


# The guest commands on saved XML build no fleet object: no stored kind's
# pydantic model, no scheduler, no store (the ops layer's guests once imported
# `ops.fit` for one helper, and with it all of these: ~30% of `guest policies`).
FLEET_OBJECTS = ("hvfleet.model.hypervisor", "hvfleet.scheduling", "hvfleet.store")
GROUP = Path(__file__).parents[2] / "examples" / "hosts" / "groups" / "intel-mixed"


@pytest.mark.parametrize("args", [
    ["guest", "policies"],
    ["guest", "generate", "--os", "rhel9.1", "--name", "b", "--vcpus", "2", "--memory", "4Gi",
     "--caps-dir", str(GROUP)],
], ids=_id)
def test_guest_commands_on_xml_import_no_fleet_objects(store: str, args: list[str]) -> None:
    code, modules = imported(args, store)
    assert code in (0, None), f"hvfleet {' '.join(args)} exited {code}"
    assert "hvfleet.guests.generate" in modules  # the probe saw the command run
    assert not {m for m in modules for f in FLEET_OBJECTS if m == f or m.startswith(f"{f}.")}


_OPTION_BUILDS = """
import collections, contextlib, io, json, sys
import typer.main
from hvfleet.cli import main as m
built = collections.Counter()
convert = typer.main.get_params_from_function
def counting(func):
    built[func.__name__] += 1
    return convert(func)
typer.main.get_params_from_function = counting
with contextlib.redirect_stdout(io.StringIO()):
    try:
        m.main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(built))
"""


@pytest.mark.parametrize("args", [["--help"], ["get", "hypervisors"]], ids=_id)
def test_the_global_options_are_not_built_per_command(store: str, args: list[str]) -> None:
    # Every command carries a copy of the global options; building them from
    # their signature once per command made `hvfleet --help` 1.4× the CPU.
    out = subprocess.run([sys.executable, "-c", _OPTION_BUILDS, *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "HVFLEET_STORE": store})
    assert out.returncode == 0, out.stderr
    built = json.loads(out.stdout.strip().splitlines()[-1])
    assert built, "the probe saw no command built"
    # A few (the app's or the listing's own callback, the one copy source), not
    # one per command: 44 for `--help` and 28 for `get` when they were.
    assert 0 < built.get("_global_options", 0) <= 4, built
