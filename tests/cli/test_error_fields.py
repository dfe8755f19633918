"""Core errors name fields; the CLI names its flags for them (hvfleet.cli.main.FLAGS).

End to end through the real entry point, plus a scan that keeps CLI flags out
of the core's messages."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import hvfleet
from hvfleet.model.errors import InvalidInput
from hvfleet.scheduling.request import parse_request

GROUPS = Path(__file__).parents[2] / "examples" / "hosts" / "groups"


@pytest.mark.parametrize(("args", "line"), [
    (["fit", "--memory", "lots"], "error: --memory: 'lots' is not a quantity"),
    (["fit", "--cpu", "1", "--resource", "VGPU"], "error: --resource: 'VGPU' is not NAME=QUANTITY"),
    (["fit", "--cpu", "1", "--resource", "VGPU=x"], "error: --resource VGPU: 'x' is not a quantity"),
    (["fit", "--cpu", "1", "--memory", "1e30"], "error: --memory: 1"),  # was "--resource memory:"
    (["reserve", "hv", "--cpu", "1", "--consumer", "00000000-0000-4000-8000-0000000000c1", "--ttl", "soon"],
     "error: --ttl: 'soon' is not a duration"),
    # Each was a multi-line pydantic dump (ReservationSpec / ... / errors.pydantic.dev).
    (["reserve", "hv", "--cpu", "0.1n", "--consumer", "00000000-0000-4000-8000-0000000000c1"],
     "error: reservation for 00000000-0000-4000-8000-0000000000c1 on hv: resources.cpu: "),
    (["reserve", "hv", "--cpu", "1", "--consumer", "00000000-0000-4000-8000-0000000000c1", "--ttl",
      "400000d"], "error: --ttl: ends "),
    (["guest", "generate", "--os", "rhel9.1", "--name", "x", "--vcpus", "0", "--memory", "1Gi",
      "--caps-dir", str(GROUPS / "single")], "error: --vcpus: 0: must be between 1 and 4096"),
    (["guest", "generate", "--os", "rhel9.1", "--name", "x", "--vcpus", "1", "--memory", "1Gi",
      "--disk", "kind=vmdk,source=/a", "--caps-dir", str(GROUPS / "single")],
     "error: --disk: 'kind=vmdk,source=/a': kind must be one of"),
])
def test_the_cli_names_its_flag_for_the_field_an_error_is_about(
    run: Any, args: list[str], line: str
) -> None:
    r = run(*args)
    assert r.code == 2, r.err
    assert r.err.startswith(line), r.err
    assert len(r.err.strip().splitlines()) == 1 and "pydantic" not in r.err, r.err


def test_the_core_names_the_field_not_the_flag() -> None:
    with pytest.raises(InvalidInput) as exc:
        parse_request("1", "lots")
    assert exc.value.field == "memory"
    assert str(exc.value).startswith("memory: 'lots' is not a quantity")


# Modules that start etcd, and so pass etcd's own flags, not hvfleet's.
# etcd_transport names etcd's own server flag in its quota advice.
_RUNS_ETCD = {"store/etcd.py", "store/etcd_transport.py"}


def test_no_core_message_names_a_cli_flag() -> None:
    root = Path(hvfleet.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("cli/", "worker/")) or rel in _RUNS_ETCD:  # the edges that define flags
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and " --" in f" {node.value}"):
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "\n".join(found)
