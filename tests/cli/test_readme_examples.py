"""Every `hvfleet` command in README.md's code blocks runs as written against
the demo store (scripts/demo: examples/fleet-spec.yaml applied, the node agent
once per host of examples/fleet/), through the console script's own entry
point, and does what the README says it does (exit 0, or the exit code the
line's comment names, e.g. `# exit 3`)."""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from hvfleet.worker.launch import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_commands() -> list[tuple[str, int]]:
    """(command line, expected exit code) for each `hvfleet` line of the
    README's ```sh blocks, continuation lines joined."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            command, _, comment = line.partition("#")
            if not command.strip().startswith("hvfleet "):
                continue
            want = re.search(r"\bexit (\d+)", comment)
            out.append((command.strip(), int(want.group(1)) if want else 0))
    return out


def run(line: str, capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    # As the shell does: variables, then file name patterns.
    words = [os.path.expandvars(a) for a in shlex.split(line)][1:]
    args = [match for w in words for match in (sorted(glob.glob(w)) if "*" in w else [w])]
    capfd.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capfd.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo store, built as scripts/demo builds it, shared by the module."""
    tmp = tmp_path_factory.mktemp("readme")
    saved = dict(os.environ)
    os.environ.update(HVFLEET_STORE=f"sqlite:///{tmp}/hvfleet.db", HVFLEET_WORKER="0",
                      XDG_RUNTIME_DIR=str(tmp), PWD=str(ROOT), HVFLEET_CACHE_DIR=str(tmp / "cache"))
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for args in (["apply", "-f", "examples/fleet-spec.yaml"],
                     *(["agent", "--connect", f"test://{f}", "--once"]
                       for f in sorted((ROOT / "examples" / "fleet").glob("*.xml")))):
            try:
                main(list(args))
            except SystemExit as exc:
                assert exc.code in (0, None), args
        yield tmp
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def test_the_readme_has_commands_of_every_family() -> None:
    names = {shlex.split(c)[1] for c, _ in readme_commands()}
    assert {"get", "fit", "reserve", "guest", "cpu", "crd", "agent", "worker"} <= names


@pytest.mark.slow  # ~10 s alone (7 agent runs, a worker start), more on a busy machine
def test_every_readme_command_runs_as_written(demo: Path, capfd: pytest.CaptureFixture[str]) -> None:
    failed, said = [], {}
    for line, want in readme_commands():
        code, out, err = run(line, capfd)
        said[line] = (out, err)
        if code != want:
            failed.append(f"{line}\n  exit {code} (README: {want}): {err.strip()[-300:]}")
        elif want and not (out + err).strip():
            failed.append(f"{line}\n  exit {code}, and not a word why")
    assert not failed, "\n".join(failed)
    # What the README's comments promise of some of them.
    edit = said["hvfleet overcommit set -l role=compute cpu=4"][0]
    assert "hypervisor/compute-01 unchanged" in edit and "hypervisor/compute-03 updated" in edit
    assert "hypervisor/lab-01 unchanged" in said["hvfleet apply -f examples/fleet-spec.yaml"][0]
    # The demo fleet serves no guests, and both commands say why in the same words.
    baseline = said["hvfleet cpu baseline --hosts role=compute"][1]
    [generate] = [err for line, (_, err) in said.items() if "generate" in line and "--hosts" in line]
    reason = "the CPU of compute-01, compute-02, compute-03 is unknown (libvirt reported no CPU model"
    assert reason in baseline and reason in generate
