"""The role table written out by hand from the issue's "Who may do what" (not
derived from ROLE_GRANTS, which is what the tests check it against): for each
role, the verbs it has on each resource and subresource. Checked in process
(tests/server/test_auth_matrix.py) and over HTTPS against the real server
(test_auth_https.py, test_api_access_review.py)."""

from __future__ import annotations

from hvfleet.model.token import Role
from hvfleet.server.identity import Verb

VERBS: tuple[Verb, ...] = ("get", "list", "watch", "create", "update", "patch", "delete")
RESOURCES = (
    "hypervisors", "hypervisors/status", "reservations", "reservations/status", "leases",
    "overcommitpolicies", "overcommitpolicies/status", "tokens", "fit", "release", "placement",
    "cpubaseline", "guests",
    # Not served: nobody, not even admin, gets them.
    "hypervisors/scale", "secrets",
)
READ = "get list watch"
COMPUTE = {"placement": "create", "cpubaseline": "create", "guests": "create"}
READS = {
    "hypervisors": READ, "hypervisors/status": "get", "reservations": READ,
    "reservations/status": "get", "leases": READ, "overcommitpolicies": READ,
    "overcommitpolicies/status": "get", **COMPUTE,
}
# The "Who may do what", by hand. Agents: on their own hypervisor's name,
# and (issue 20) reading the OvercommitPolicies that select their own host.
EXPECTED: dict[Role, dict[str, str]] = {
    "viewer": READS,
    "operator": {
        **READS, "hypervisors": f"{READ} create update patch delete",
        "reservations": f"{READ} delete", "fit": "create",
        "overcommitpolicies": f"{READ} create update patch delete",
    },
    "scheduler": {
        **READS, "hypervisors": f"{READ} update patch", "reservations": f"{READ} create",
        "reservations/status": "get update patch", "fit": "create", "release": "create",
    },
    "agent": {
        "hypervisors": "get list watch create",
        "hypervisors/status": "get update patch",
        "leases": "get create update patch delete",
        "overcommitpolicies": READ,
    },
    "admin": {
        **READS, "hypervisors": f"{READ} create update patch delete",
        "reservations": f"{READ} create delete", "reservations/status": "get update patch",
        "fit": "create", "release": "create",
        "overcommitpolicies": f"{READ} create update patch delete",
        "tokens": "get list watch create update patch delete",
    },
}
