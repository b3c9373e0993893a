"""The benchmark's scores, per case and overall, as a table and as JSON."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from evotrainer.faultbench.run import CaseResult


def overall(results: Sequence[CaseResult]) -> dict[str, Any]:
    """Shares over the cases; `repaired` over the cases a backtest can judge (not a live case, and
    the fault shows on the held-out slice)."""
    ran = list(results)
    loops = [r.agent_loop for r in ran if r.agent_loop]

    def share(key: str) -> float | None:
        scored = [r for r in ran if getattr(r, key) is not None]
        return round(sum(bool(getattr(r, key)) for r in scored) / len(scored), 4) if scored else None

    return {"cases": len(ran), "replayable": sum(r.repaired is not None for r in ran),
            "detected": share("detected"), "repaired": share("repaired"), "safe": share("safe"),
            "tempting_promoted": sum(t.decision == "promote" for r in ran for t in r.tempting),
            "tempting_total": sum(len(r.tempting) for r in ran),
            "proposals": sum(r.proposals for r in ran), "backtests": sum(r.backtests for r in ran),
            "seconds": round(sum(r.seconds for r in ran), 1),
            # a tool-using agent's rounds (propose/llm_tools.py): how they ended and what they used
            **({"tool_calls": sum(loop["tool_calls"] for loop in loops),
                "tokens": sum(loop["tokens"] for loop in loops),
                "endings": dict(Counter(loop["ending"] for loop in loops))} if loops else {})}


def to_json(results: Sequence[CaseResult], agent: str) -> dict[str, Any]:
    return {"agent": agent, "overall": overall(results), "cases": [r.to_json() for r in results]}


def _why_none(r: CaseResult) -> str:
    """Why a case scores no repair: it is live, or its fault does not show in its rollouts."""
    return "live pilot needed" if r.note and r.note.startswith("live") else "fault does not show"


def _loop_cost(r: CaseResult) -> str:
    """A tool-using agent's round: its tool calls, tokens and how it ended."""
    loop = r.agent_loop
    return f", {loop['tool_calls']} calls, {loop['tokens']} tok, {loop['ending']}" if loop else ""


def _mark(value: bool | None) -> str:
    return "[dim]-[/]" if value is None else "[green]yes[/]" if value else "[red]no[/]"


def table(results: Sequence[CaseResult], agent: str) -> Table:
    t = Table(title=f"harness-fault benchmark · {agent} agent")
    for col in ("case", "domain", "fault", "detected", "repaired", "safe", "promoted", "cost"):
        t.add_column(col)
    for r in results:
        promoted = f"[dim]{_why_none(r)}[/]" if r.repaired is None else (r.promoted or "nothing").removeprefix("candidate/")
        why = "; ".join(r.unsafe)
        t.add_row(r.case, r.domain, r.fault, _mark(r.detected), _mark(r.repaired), _mark(r.safe),
                  promoted + (f" [red]({why})[/]" if why else ""),
                  f"{r.proposals} prop, {r.backtests + len(r.tempting)} bt, {r.seconds:.0f}s" + _loop_cost(r))
    o = overall(results)
    if o["cases"]:
        t.add_section()
        pct = lambda v: "-" if v is None else f"{100 * v:.0f}%"  # noqa: E731
        t.add_row(f"overall ({o['cases']} cases)", "", "", pct(o["detected"]), pct(o["repaired"]), pct(o["safe"]),
                  f"{o['tempting_promoted']}/{o['tempting_total']} tempting fixes promoted",
                  f"{o['proposals']} prop, {o['seconds']:.0f}s")
    return t


def markdown(results: Sequence[CaseResult], agent: str) -> str:
    """The scores as a Markdown table (what docs/results.md shows), one row per case plus overall."""
    def mark(value: bool | None) -> str:
        return "-" if value is None else "yes" if value else "**no**"

    lines = [f"| case ({agent} agent) | fault | detected | repaired | safe | promoted |", "|---|---|---|---|---|---|"]
    for r in results:
        promoted = _why_none(r) if r.repaired is None else (r.promoted or "nothing").removeprefix("candidate/")
        lines.append(f"| {r.case} | {r.fault} | {mark(r.detected)} | {mark(r.repaired)} | {mark(r.safe)} | {promoted} |")
    o = overall(results)
    pct = lambda v: "-" if v is None else f"{100 * v:.0f}%"  # noqa: E731
    lines.append(f"| **overall**, {o['cases']} cases | {o['tempting_promoted']}/{o['tempting_total']} tempting "
                 f"fixes promoted | {pct(o['detected'])} | {pct(o['repaired'])} of {o['replayable']} | "
                 f"{pct(o['safe'])} | {o['proposals']} proposals |")
    return "\n".join(lines) + "\n"


__all__ = ["markdown", "overall", "table", "to_json"]
