"""Status classification and the markdown report of the AOT compile check."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aot_parse import ERROR, LDS_LIMITS, OK, SPILL


def classify(rec: dict[str, Any], fail_on_spill: bool = False) -> tuple[str, bool]:
    """Sets ``rec['status']`` (OK / SPILL / ERROR) from the figures; returns (status, is_failure).

    ERROR: compile failed, or LDS/shared bytes over the target's limit. SPILL: any register
    spill (VGPR/SGPR spill counts on AMD, spill stores/loads on sm_90).
    """
    target = rec["target"]
    if rec.get("error"):
        rec["status"] = ERROR
    elif rec.get("lds_bytes", 0) > LDS_LIMITS[target]:
        rec["status"] = ERROR
        rec["error"] = f"LDS {rec['lds_bytes']} B > {target} limit {LDS_LIMITS[target]} B"
    elif (
        rec.get("vgpr_spill_count", 0)
        or rec.get("sgpr_spill_count", 0)
        or rec.get("spill_stores", 0)
        or rec.get("spill_loads", 0)
    ):
        rec["status"] = SPILL
    else:
        rec["status"] = OK
    failing = rec["status"] == ERROR or (fail_on_spill and rec["status"] == SPILL)
    return rec["status"], failing


# ---- report --------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def _notes(rec: dict[str, Any]) -> str:
    parts = list(rec.get("notes", []))
    if rec.get("error"):
        parts.insert(0, rec["error"])
    return "; ".join(parts).replace("|", "\\|")


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(_fmt(c) for c in cells) + " |"


def target_table(target: str, recs: Sequence[dict[str, Any]]) -> list[str]:
    amd = target != "sm_90"
    if amd:
        head = [
            "kernel", "config", "default", "VGPR", "AGPR", "SGPR", "spill (v/s)",
            "scratch B", "LDS B", "occ", "MFMA", "compile s", "status", "notes",
        ]  # fmt: skip
    else:
        head = [
            "kernel", "config", "default", "regs", "spill st/ld B", "stack B", "smem B",
            "wgmma", "compile s", "status", "notes",
        ]  # fmt: skip
    lines = [f"## {target} (LDS limit {LDS_LIMITS[target]} B)", "", _row(head)]
    lines.append("|" + "---|" * len(head))
    for r in recs:
        ok = r.get("lds_bytes") is not None  # figures exist (compiled, maybe over LDS)
        common = [r["kernel"], f"`{r['config']}`", "yes" if r.get("default") else ""]
        if amd:
            spill = f"{r.get('vgpr_spill_count')}/{r.get('sgpr_spill_count')}" if ok else None
            figs = [
                r.get("vgpr_count"), r.get("agpr_count"), r.get("sgpr_count"), spill,
                r.get("private_segment_fixed_size"), r.get("lds_bytes"), r.get("occupancy"),
                r.get("mfma_count"),
            ]  # fmt: skip
        else:
            spill = f"{r.get('spill_stores')}/{r.get('spill_loads')}" if ok else None
            figs = [
                r.get("regs"), spill, r.get("stack_bytes"), r.get("lds_bytes"),
                r.get("wgmma_count"),
            ]  # fmt: skip
        lines.append(_row(common + figs + [r.get("compile_s"), r["status"], _notes(r)]))
    return lines + [""]


def summarize(
    results: Sequence[dict[str, Any]], targets: Sequence[str], elapsed: float, fail_on_spill: bool
) -> tuple[list[str], int]:
    """Summary lines (markdown-compatible plain text) and the exit code."""
    lines = [f"AOT check: {len(results)} results in {elapsed:.1f} s"]
    failing = 0
    for t in targets:
        recs = [r for r in results if r["target"] == t]
        counts = {s: sum(r["status"] == s for r in recs) for s in (OK, SPILL, ERROR)}
        lines.append(
            f"- {t}: {len(recs)} configs, {counts[OK]} OK, {counts[SPILL]} SPILL, "
            f"{counts[ERROR]} ERROR"
        )
    for r in results:
        failing += classify(r, fail_on_spill)[1]
    spills = [r for r in results if r["status"] == SPILL]
    errors = [r for r in results if r["status"] == ERROR]
    warns = [r for r in results if r["status"] != ERROR and r.get("notes")]
    if spills:
        lines.append("")
        lines.append("Spilling configs" + (" (errors: --fail-on-spill)" if fail_on_spill else ""))
        for r in spills:
            if r["target"] == "sm_90":
                detail = (
                    f"{r['regs']} regs, spill stores {r['spill_stores']} B / loads "
                    f"{r['spill_loads']} B, stack {r['stack_bytes']} B"
                )
            else:
                detail = (
                    f"VGPR {r['vgpr_count']} AGPR {r['agpr_count']}, spills "
                    f"v{r['vgpr_spill_count']}/s{r['sgpr_spill_count']}, "
                    f"scratch {r['private_segment_fixed_size']} B"
                )
            star = " (default)" if r.get("default") else ""
            lines.append(f"- {r['target']} {r['config']}{star}: {detail}")
    if errors:
        lines.append("")
        lines.append("Errors")
        for r in errors:
            lines.append(f"- {r['target']} {r['config']}: {r['error']}")
    if warns:
        by_note: dict[str, list[str]] = {}
        for r in warns:
            for note in r["notes"]:
                by_note.setdefault(note, []).append(f"{r['target']} {r['config']}")
        lines.append("")
        lines.append("Notes")
        for note, where in by_note.items():
            shown = ", ".join(where[:4]) + (
                f", ... ({len(where)} in all)" if len(where) > 4 else ""
            )
            lines.append(f"- {note}: {shown}")
    lines.append("")
    lines.append("RESULT: " + ("FAIL" if failing else "PASS") + f" ({failing} failing)")
    return lines, 1 if failing else 0


def write_markdown(
    path: Path,
    results: Sequence[dict[str, Any]],
    targets: Sequence[str],
    summary: Sequence[str],
    header: dict[str, Any],
) -> None:
    lines = ["# Triton AOT compile report", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    lines.append("")
    for t in targets:
        lines += target_table(t, [r for r in results if r["target"] == t])
    lines += ["## Summary", ""]
    lines += list(summary)
    tracebacks = [r for r in results if r.get("traceback")]
    if tracebacks:
        lines += ["", "## Error details", ""]
        for r in tracebacks:
            lines += [f"### {r['target']} {r['config']}", "", "```", r["traceback"].rstrip(), "```"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


# ---- CLI -----------------------------------------------------------------------------------
