"""`hvfleet kubeconfig`: a kubeconfig for kubectl and Kubernetes clients.

    hvfleet kubeconfig --server https://127.0.0.1:8443 --token hvf_… [--ca FILE | --data-dir DIR] [-o FILE]

Without `--ca`, the CA of the `hvfleet serve` on this machine (its data dir's
tls/ca.crt) is embedded, after checking it signed what that server serves; a
server elsewhere needs `--ca` (store.kubeconfig.local_server_ca says why).
The file holds the token, so `-o` writes it owner-only (0600).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from hvfleet.cli.main import app
from hvfleet.model.errors import InvalidInput
from hvfleet.store.kubeconfig import (
    DATA_DIR_ENV,
    DEFAULT_NAME,
    check_credentials,
    dump_kubeconfig,
    local_server_ca,
    render_kubeconfig,
)


@app.command("kubeconfig")
def kubeconfig(
    server: Annotated[str, typer.Option("--server", help="The API server, e.g. https://127.0.0.1:8443.")],
    token: Annotated[str, typer.Option("--token", envvar="HVFLEET_TOKEN", help="A bearer token.")],
    ca: Annotated[
        str | None, typer.Option("--ca", help="CA certificate (PEM) to embed, e.g. the one serve printed.")
    ] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(
            "--data-dir",
            envvar=DATA_DIR_ENV,
            help="Data dir of the local `hvfleet serve`, whose CA is embedded without --ca "
            "(default ./hvfleet-data).",
        ),
    ] = None,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="File to write (default stdout).")
    ] = None,
    name: Annotated[str, typer.Option("--name", help="Cluster, user and context name.")] = DEFAULT_NAME,
) -> None:
    """Write a kubeconfig (CA embedded) that kubectl and the Kubernetes clients use as is."""
    check_credentials(server, token)
    ca_pem: bytes | None = None
    if ca is not None:
        try:
            with open(ca, "rb") as f:
                ca_pem = f.read()
        except OSError as exc:
            raise InvalidInput(f"ca: {ca}: cannot read: {exc.strerror}") from None
    else:
        try:
            ca_pem = local_server_ca(server, data_dir)
        except InvalidInput as exc:
            # The core says what is missing; the flags that give it are this edge's.
            raise InvalidInput(f"{exc.detail} (pass --ca FILE, or --data-dir DIR of a local server)",
                               field=exc.field) from None
    text = dump_kubeconfig(render_kubeconfig(server, token, ca_pem, name))
    if output is None:
        sys.stdout.write(text)
        return
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        raise InvalidInput(f"output: {output}: cannot write: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
    print(f"kubeconfig written to {output}", file=sys.stderr)
