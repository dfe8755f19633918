"""`make bench` (scripts/bench) runs every script under bench/ with no
argument, but for the tools listed in bench/TOOLS: so each bench it runs must
need none (a required option or positional argument stopped the whole run at
the first such script, bench/compare.py), and each tool listed must exist.
Read from the scripts' argparse calls (ast), not by running them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
TOOLS = set((BENCH / "TOOLS").read_text().split())


def _required_arguments(source: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            continue
        name = node.args[0].value
        keywords = {k.arg: k.value for k in node.keywords}
        if name.startswith("-"):
            required = keywords.get("required")
            if isinstance(required, ast.Constant) and required.value is True:
                out.append(name)
        else:
            nargs = keywords.get("nargs")
            if not (isinstance(nargs, ast.Constant) and nargs.value in ("?", "*")):
                out.append(name)
    return out


def test_the_tools_listed_exist() -> None:
    assert TOOLS
    assert sorted(t for t in TOOLS if not (BENCH / f"{t}.py").is_file()) == []


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_each_bench_make_bench_runs_needs_no_argument(script: str) -> None:
    source = (BENCH / script).read_text()
    required = _required_arguments(source)
    if script.removesuffix(".py") in TOOLS:
        return
    assert required == [], f"bench/{script} needs {required}: list it in bench/TOOLS or give defaults"
    assert '__name__ == "__main__"' in source, f"bench/{script} does nothing when run"


def test_the_reader_finds_required_arguments() -> None:
    """The check itself: the tools' own required arguments are found."""
    assert _required_arguments((BENCH / "compare.py").read_text()) == ["--base"]
    assert _required_arguments((BENCH / "profile_top.py").read_text()) == ["file"]
    assert _required_arguments('ap.add_argument("rounds", nargs="?")') == []
