"""The golden matrix: OS × host group, per policy version.

Run `python -m tests.guests.golden` to write the files of a *new* policy
version. Files that exist are never rewritten: a released policy is frozen,
and a test fails if its output changes.
"""

from __future__ import annotations

import re
from pathlib import Path

from hvfleet.guests.generate import generate
from hvfleet.guests.hosts import load_caps_dir
from hvfleet.guests.request import DiskSpec, GuestRequest, NicSpec

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
GROUPS_DIR = HERE.parents[1] / "examples" / "hosts" / "groups"

OSES = ("win11", "win2k22", "rhel9.1", "ubuntu22.04", "fedora37", "linux2022")
# same vendor and generation, mixed generations (one host with an older
# QEMU/libvirt), a single host, and an AMD group.
GROUPS = ("intel-same", "intel-mixed", "single", "amd-mixed")
_VERSION_RE = re.compile(r"<hvfleet:version>[^<]*</hvfleet:version>")


def request(os: str, policy: str) -> GuestRequest:
    return GuestRequest(
        os=os,
        name=f"golden-{os.replace('.', '-')}",
        vcpus=4,
        memory=8 << 30,
        disks=(
            DiskSpec.parse("kind=qcow2,source=/var/lib/hvfleet/images/root.qcow2"),
            DiskSpec.parse("kind=block,source=/dev/vg0/data"),
            DiskSpec.parse("kind=network,protocol=rbd,source=vms/scratch,host=mon1:6789"),
        ),
        nics=(NicSpec.parse("network=default"), NicSpec.parse("bridge=br0,mac=52:54:00:aa:bb:cc")),
        policy=policy,
        # From 2026.2 on, the Windows cases declare the virtio-win drivers
        # (2026.1 predates declared drivers, its files stay as released).
        drivers=("virtio-win",) if os.startswith("win") and policy != "2026.1" else (),
    )


def normalize(xml: str) -> str:
    """The hvfleet version in <metadata> is provenance, not guest ABI."""
    return _VERSION_RE.sub("<hvfleet:version>*</hvfleet:version>", xml)


def render(os: str, group: str, policy: str) -> str:
    xml, _ = generate(request(os, policy), load_caps_dir(str(GROUPS_DIR / group)))
    return normalize(xml)


def path(policy: str, os: str, group: str) -> Path:
    return GOLDEN / policy / f"{os}--{group}.xml"


def main() -> None:
    from hvfleet.guests.policy import POLICIES

    for policy in POLICIES:
        for os in OSES:
            for group in GROUPS:
                p = path(policy, os, group)
                if p.exists():
                    continue
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(render(os, group, policy))
                print(f"wrote {p}")


if __name__ == "__main__":
    main()
