"""The decision table: per decision its value, reason and evidence, as text."""

from __future__ import annotations

from hvfleet.guests.plan import Plan


def explain(plan: Plan, evidence_limit: int = 8) -> str:
    req = plan.request
    lines = [
        f"guest {req.name}: {plan.os.name} ({plan.os.short_id}), {req.vcpus} vCPU, "
        f"{req.memory // (1024 * 1024)} MiB",
        f"policy {plan.policy.version} ({plan.policy.changelog})",
        f"mode {req.mode}; inputs {plan.digest}",
        "",
    ]
    for d in plan.decisions():
        lines.append(f"{d.area:<12} {d.shown}")
        lines.append(f"{'':<12} why: {d.reason}")
        for e in d.evidence[:evidence_limit]:
            lines.append(f"{'':<12}   - {e}")
        if len(d.evidence) > evidence_limit:
            lines.append(f"{'':<12}   - … {len(d.evidence) - evidence_limit} more")
    if plan.warnings:
        lines.append("")
        lines.extend(f"warning: {w}" for w in plan.warnings)
    if plan.notes:
        lines.append("")
        lines.append("notes:")
        lines.extend(f"  - {n}" for n in plan.notes)
    return "\n".join(lines) + "\n"
