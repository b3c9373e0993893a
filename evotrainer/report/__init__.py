"""The run report: a static HTML site (overview, harness lineage, backtests, diagnostics,
rollouts, skills) built from a workspace, viewable offline.

    summary = build_report("evotrainer-work")   # writes evotrainer-work/report/index.html
"""

from evotrainer.report.site import ReportError, ReportSummary, build_report

__all__ = ["ReportError", "ReportSummary", "build_report"]
