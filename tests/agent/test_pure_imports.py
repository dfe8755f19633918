"""The agent's pure side (the reconcile pipeline, the status writer) and the
discovery parsers import without libvirt-python: they take values, so a
scheduler, the server or a test can use them on a machine without the binding."""

from __future__ import annotations

import subprocess
import sys

PURE = ["hvfleet.agent.reconcile", "hvfleet.agent.status_writer", "hvfleet.agent.backoff",
        "hvfleet.discovery.domains", "hvfleet.discovery.host", "hvfleet.discovery.capabilities"]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_the_reconcile_pipeline_imports_with_libvirt_blocked() -> None:
    code = (
        "import sys\n"
        "sys.modules['libvirt'] = None  # any `import libvirt` now raises ImportError\n"
        f"for m in {PURE!r}:\n"
        "    __import__(m)\n"
        "from hvfleet.agent.reconcile import Observation, reconcile\n"
        "print('ok')\n"
    )
    r = _run(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_blocking_libvirt_does_block_the_connection_module() -> None:
    # The check above could pass vacuously if blocking did nothing.
    r = _run("import sys; sys.modules['libvirt'] = None; import hvfleet.discovery.libvirt_conn")
    assert r.returncode != 0 and "import of libvirt halted" in r.stderr


def test_the_agent_command_loads_no_other_command_family() -> None:
    code = (
        "import sys\n"
        "from hvfleet.cli.main import main\n"
        "try:\n"
        "    main(['agent', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('hvfleet.cli.'))\n"
        "print(','.join(loaded))\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    # cli.entry is the CLI's entry point (no imports of its own), whose command_of main() uses.
    assert r.stdout.strip().splitlines()[-1] == "hvfleet.cli.agent,hvfleet.cli.entry,hvfleet.cli.main"
