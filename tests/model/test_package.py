"""`hvfleet.model` re-exports its names lazily: each resolves to its home module's
object, and importing a light module does not build the pydantic models."""

from __future__ import annotations

import importlib
import subprocess
import sys

import hvfleet.model as model


def test_every_exported_name_resolves_to_its_home() -> None:
    assert sorted(model.__all__) == sorted(model._MODULE_OF)
    for name, home in model._MODULE_OF.items():
        assert getattr(model, name) is getattr(importlib.import_module(f"hvfleet.model.{home}"), name)


def test_importing_the_errors_does_not_import_pydantic() -> None:
    code = ("import sys, hvfleet.model.errors, hvfleet.model.durations; "
            "print(sorted(m for m in ('pydantic', 'hvfleet.model.hypervisor') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
