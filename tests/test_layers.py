"""The package layering of ARCHITECTURE.md, checked on every import statement
(lazy ones inside functions included): no package imports one it may not, so
there is no agent → cli cycle and the pure core stays free of the edges."""

from __future__ import annotations

import ast
from pathlib import Path

import hvfleet

MAY_IMPORT = {
    "model": set(),
    "discovery": {"model"},
    "store": {"model"},
    "agent": {"model", "discovery", "store"},
    "scheduling": {"model", "store"},
    "guests": {"model", "discovery"},
    # The operations every edge offers: above the core, below the edges.
    "ops": {"model", "discovery", "store", "scheduling", "guests"},
    # Presentation: above the model and scheduling, below the edges.
    "views": {"model", "scheduling"},
    # The Placement API's core: above the store and scheduling, below the server.
    "placement": {"model", "store", "scheduling"},
    "server": {"model", "discovery", "store", "agent", "scheduling", "guests", "ops", "views", "placement"},
    "cli": {"model", "discovery", "store", "agent", "scheduling", "guests", "ops", "views", "placement"},
}


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
    return [(n, m) for n, m in out if m.startswith("hvfleet.")]


def test_every_package_imports_only_what_the_architecture_allows() -> None:
    root = Path(hvfleet.__file__).parent
    wrong = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if len(parts) < 2:
            continue
        package = parts[0]
        assert package in MAY_IMPORT, f"{package}: a new package needs a row in ARCHITECTURE.md"
        for line, module in _imports(ast.parse(path.read_text())):
            target = module.split(".")[1]
            if target != package and target not in MAY_IMPORT[package]:
                wrong.append(f"{'/'.join(parts)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)
