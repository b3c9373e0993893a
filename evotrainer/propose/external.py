"""The external outer agent: any MCP client (Claude Code, an IDE, a script) drives a round through
`evotrainer mcp`, and the loop waits for it.

The loop writes the round's session file (`<workdir>/agent/<run>/round-<k>.session.json`: the
budgets and the gate the server should use) and the playbook (`<workdir>/agent/PLAYBOOK.md`),
then polls for the agent's finish marker (the `finish_round` tool), a full set of submissions,
or the timeout. Then it closes the round (the marker, written by the loop if the agent did not)
so that no submission lands after the loop has read them, and hands the submitted branches to
the backtest stage. Nothing the agent ran counts for the gate: the loop backtests again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from evotrainer.jsonfile import write_json
from evotrainer.tools.act import mark_done, read_done, read_submissions

TEMPLATES = Path(__file__).parent / "templates"
PLAYBOOK = "PLAYBOOK.md"

# How a round's wait ended: each is a value the round's record counts.
FINISHED = "finished"  # the agent called finish_round
SUBMIT_LIMIT = "submit_limit"  # it submitted as many candidates as it may
TIMEOUT = "timeout"  # coevolve.external.timeout_s passed first


def session_path(workdir: Path | str, run: str, round_index: int) -> Path:
    return Path(workdir) / "agent" / run / f"round-{round_index}.session.json"


def playbook_path(workdir: Path | str) -> Path:
    return Path(workdir) / "agent" / PLAYBOOK


def write_session(workdir: Path, run: str, round_index: int, config: Any) -> dict[str, Any]:
    """What `evotrainer mcp` serves this round with: the loop's own budgets, gate and store."""
    ext = config.coevolve.external
    session = {"run": run, "round": round_index, "max_calls": ext.max_calls,
               "max_submissions": ext.max_submissions, "gate": config.gate.model_dump(mode="json"),
               "store_url": config.store.url, "workers": config.executor.workers, "timeout_s": ext.timeout_s,
               "opened_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_json(session_path(workdir, run, round_index), session, indent=2)
    return session


def render_playbook(*, workdir: Path, run: str, round_index: int, domain: str, session: Mapping[str, Any],
                    alerts: Sequence[str], tools: Sequence[Any]) -> str:
    env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined, keep_trailing_newline=True)
    groups: dict[str, list[Any]] = {}
    for t in tools:
        groups.setdefault(t.group, []).append(t)
    return env.get_template("external_playbook.md.j2").render(
        workdir=workdir, run=run, round=round_index, domain=domain, session=session, alerts=list(alerts),
        groups=groups, command=mcp_command(workdir))


def mcp_command(workdir: Path) -> str:
    return f"evotrainer mcp --workdir {workdir.resolve()}"


@dataclass(frozen=True)
class Waited:
    """How an external agent's round ended, and what it submitted."""

    outcome: str  # FINISHED | SUBMIT_LIMIT | TIMEOUT
    submissions: list[dict[str, Any]]
    seconds: float
    note: str = ""


def wait_for_agent(workdir: Path, run: str, round_index: int, *, timeout_s: float, poll_s: float,
                   max_submissions: int, sleep: Callable[[float], None] = time.sleep) -> Waited:
    """Poll until the agent finishes, fills its submissions, or `timeout_s` passes; then close the
    round. A KeyboardInterrupt leaves everything as it was: `coevolve --resume` waits again."""
    started = time.monotonic()
    while True:
        done = read_done(workdir, run, round_index)
        n = len(read_submissions(workdir, run, round_index))
        elapsed = time.monotonic() - started
        if done is not None:
            outcome = done.get("outcome", FINISHED)
            break
        if n >= max_submissions:
            outcome = SUBMIT_LIMIT
            break
        if elapsed >= timeout_s:
            outcome = TIMEOUT
            break
        sleep(min(poll_s, max(timeout_s - elapsed, 0.01)))
    if done is None:  # the loop closes the round itself; a submission from now on is refused
        done = mark_done(workdir, run, round_index, note=f"closed by the loop: {outcome}", outcome=outcome)
    # Read again after the marker: a submission that landed while the loop was closing counts.
    return Waited(outcome, read_submissions(workdir, run, round_index), time.monotonic() - started,
                  done.get("note", ""))
