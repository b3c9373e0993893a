"""Diagnose: run a harness's own probes over stored rollouts and say what is unhealthy.

    report = health_report(harness, store.iter_rollouts(run_id=1, round_index=2))
    report.alerts        # probes at warn/critical, each with up to 3 example rollout ids
    report.to_json()     # {"probes": [{"name", "dimension", "value", "level", ...}], ...}
"""

from evotrainer.diagnose.health import (
    LEVELS,
    Example,
    HealthReport,
    ProbeResult,
    health_report,
    write_report,
)

__all__ = ["LEVELS", "Example", "HealthReport", "ProbeResult", "health_report", "write_report"]
