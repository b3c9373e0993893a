"""Health reports for people: rich tables per dimension for the terminal, Markdown for files."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.panel import Panel
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from evotrainer.diagnose.health import Example, HealthReport, ProbeResult

LEVEL_STYLE = {"ok": "green", "warn": "yellow", "critical": "bold red", "n/a": "dim"}


def fmt_value(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"


def _rule(p: ProbeResult) -> str:
    sign = ">" if p.direction == "above" else "<"
    return f"warn {sign} {p.warn:g}, critical {sign} {p.critical:g}"


def dimension_tables(report: HealthReport) -> list[Table]:
    """One table per dimension, probes in harness order."""
    tables = []
    for dim in report.dimensions():
        table = Table(title=dim, title_justify="left", title_style="bold")
        for col, justify in (("probe", "left"), ("value", "right"), ("level", "left"),
                             ("thresholds", "left"), ("examples", "left")):
            table.add_column(col, justify=justify, overflow="fold")
        for p in report.probes:
            if p.dimension != dim:
                continue
            level = Text(p.level, style=LEVEL_STYLE.get(p.level, ""))
            note = Text(p.error or "", style="red") if p.error else Text(", ".join(i[:12] for i in p.examples))
            table.add_row(p.name, fmt_value(p.value), level, _rule(p), note)
        tables.append(table)
    return tables


def example_panel(ex: Example, probes: str) -> Panel:
    head = Text.assemble((ex.kind, "bold"), "  success ", ("yes" if ex.success else "no",
                         "green" if ex.success else "red"), f"  reward {ex.reward:+.3f}",
                         f"  {ex.num_tokens} tokens", "  truncated" if ex.truncated else "",
                         f"  {ex.turns} turns" if ex.turns else "", (f"  task {ex.task_id}", "dim"))
    # Text(), never markup: completions are full of [brackets] that rich would eat.
    return Panel(Text.assemble(head, "\n", Text(ex.preview or "(empty)")),
                 title=Text(f"{probes}: rollout {ex.id}"), title_align="left", border_style="dim")


def alert_panels(report: HealthReport) -> list[Panel]:
    """One panel per example rollout (critical alerts' first), titled with every alert it shows."""
    shows: dict[str, list[str]] = {}
    for p in report.alerts:
        for rid in p.examples:
            if rid in report.examples:
                shows.setdefault(rid, []).append(p.name)
    return [example_panel(report.examples[rid], ", ".join(names)) for rid, names in shows.items()]


def summary_line(report: HealthReport) -> Text:
    alerts = report.alerts
    crit = sum(p.level == "critical" for p in alerts)
    text = Text(f"{report.n_rollouts} rollouts in {report.n_groups} groups ({report.scope}, "
                f"{(report.harness_version or '?')[:12]}): ")
    if report.source_reported:
        text.append(f"[{source_reported_note(report)}] ", style="yellow")
    if not alerts:
        return text.append("no alerts", style="green")
    text.append(f"{crit} critical", style="bold red" if crit else "")
    text.append(f", {len(alerts) - crit} warn", style="yellow" if len(alerts) > crit else "")
    return text


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def source_reported_note(report: HealthReport) -> str:
    return (f"outcomes of {report.source_reported} of {report.n_rollouts} rollouts are source-reported "
            "(another engine's correctness field, imported with --outcome-field), not verified by evotrainer")


def report_markdown(report: HealthReport) -> str:
    lines = [f"# Health report ({report.scope})", "",
             f"{report.n_rollouts} rollouts in {report.n_groups} groups, harness "
             f"`{report.harness_version or '?'}`.", ""]
    if report.source_reported:
        lines += [f"**Outcomes:** {source_reported_note(report)}.", ""]
    alerts = report.alerts
    if alerts:
        lines += ["**Alerts:** " + "; ".join(f"{p.describe()}" for p in alerts), ""]
    else:
        lines += ["No alerts.", ""]
    for dim in report.dimensions():
        lines += [f"## {dim}", "", "| probe | value | level | thresholds | examples |",
                  "|---|---:|---|---|---|"]
        for p in report.probes:
            if p.dimension == dim:
                note = f"error: {p.error}" if p.error else ", ".join(f"`{i}`" for i in p.examples)
                lines.append(f"| {p.name} | {fmt_value(p.value)} | {p.level} | {_rule(p)} | {_md_cell(note)} |")
        lines.append("")
    if alerts:
        lines += ["## Examples", ""]
        for p in alerts:
            for rid in p.examples:
                ex = report.examples.get(rid)
                if ex is None:
                    continue
                lines += [f"- **{p.name}** `{ex.id}` (task `{ex.task_id}`, {ex.kind}, "
                          f"reward {ex.reward:+.3f}, {ex.num_tokens} tokens"
                          f"{', truncated' if ex.truncated else ''}): {_md_cell(ex.preview) or '(empty)'}"]
        lines.append("")
    return "\n".join(lines)
