"""Analyse and act: run a probe or the agent's own analysis (sandboxed), write and revise candidates,
backtest them, submit at most N for the round, and finish the round.

Nothing here promotes, merges or reverts: a candidate is a branch (HarnessRepo.propose), a
backtest is the engine's and the gate's (evotrainer.backtest), a submission is a record in
`<workdir>/agent/<run>/round-<k>.submitted.json` for the loop to pick up, and finishing writes
`round-<k>.done.json`, the marker an external agent's round waits for (propose/external.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from evotrainer.api import Rollout
from evotrainer.diagnose.targets import retarget
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import HarnessError
from evotrainer.harness.repo import CANDIDATE_PREFIX, MAIN, HarnessRepoError
from evotrainer.jsonfile import write_json
from evotrainer.store import StoredRollout
from evotrainer.tools.read import ROUND, check_path, summary
from evotrainer.tools.registry import BAD_ARGUMENTS, FAILED, NOT_FOUND, REFUSED, SUBMIT_LIMIT, ToolError, tool
from evotrainer.tools.surface import Toolbox, public_meta

ANALYSIS_PROBE = "analysis"
ANALYSIS_FN = "analyse"
DIAGNOSTICS = "diagnostics.py"
_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")  # as HarnessRepo.propose checks it, before the sandbox load

TEXT = {"type": "string", "minLength": 1, "maxLength": 2000}
SLUG = {"type": "string", "minLength": 1, "maxLength": 48, "description": "lowercase words joined by '-'"}
EDITS = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 200_000},
         "description": "harness file name at the repo root -> its full new text"}
BRANCH = {"type": "string", "minLength": 1, "maxLength": 200, "description": "a candidate branch of this round"}


def submissions_path(workdir: Path | str, run: str, round_index: int) -> Path:
    return Path(workdir) / "agent" / run / f"round-{round_index}.submitted.json"


def read_submissions(workdir: Path | str, run: str, round_index: int) -> list[dict[str, Any]]:
    """The candidates the agent submitted for a round, in order (the loop's input; [] when none)."""
    path = submissions_path(workdir, run, round_index)
    return list(json.loads(path.read_text(encoding="utf-8"))["candidates"]) if path.is_file() else []


def done_path(workdir: Path | str, run: str, round_index: int) -> Path:
    return Path(workdir) / "agent" / run / f"round-{round_index}.done.json"


def read_done(workdir: Path | str, run: str, round_index: int) -> dict[str, Any] | None:
    """The agent's finish record for a round ({note, submitted, finished_at}), or None before it."""
    path = done_path(workdir, run, round_index)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def mark_done(workdir: Path | str, run: str, round_index: int, note: str = "",
              outcome: str = "finished") -> dict[str, Any]:
    """Close a round to submissions: the agent's finish_round, or the loop when it stops waiting."""
    record = {"run": run, "round": round_index, "outcome": outcome, "note": note,
              "submitted": [s["branch"] for s in read_submissions(workdir, run, round_index)],
              "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_json(done_path(workdir, run, round_index), record, indent=2)
    return record


def _public(sr: StoredRollout) -> Rollout:
    """The rollout as the agent's own code may see it: no answer, and the training step as
    diagnose gives it to probes."""
    meta = public_meta(sr.rollout.meta)
    if sr.step is not None:
        meta["train_step"] = sr.step
    return dataclasses.replace(sr.rollout, meta=meta)


def _round_batch(tb: Toolbox, index: int) -> tuple[list[StoredRollout], list[float]]:
    """The round's visible rollouts, each group together, and main's training rewards for them."""
    from evotrainer.diagnose.health import by_group

    rows = list(tb.rollouts(index))
    order = {r.id: i for i, r in enumerate(by_group(sr.rollout for sr in rows))}
    rows.sort(key=lambda sr: order[sr.rollout.id])
    if not rows:
        raise ToolError(NOT_FOUND, f"round {index} of run {tb.run!r} has no rollout to analyse")
    with tb.repo.load(MAIN) as main:
        rewards = [main.training_reward(c) for c in main.rewards([sr.rollout for sr in rows])]
    return rows, rewards


def _examples(ids: tuple[str, ...], rows: list[StoredRollout], tb: Toolbox) -> list[dict[str, Any]]:
    by_id = {sr.rollout.id: sr for sr in rows}
    rounds = tb.round_ids()
    return [summary(by_id[i], rounds) for i in ids if i in by_id]


@tool("run_probe", "Run one probe of main's diagnostics.py over a round's rollouts: value, level and examples.",
      "analyse", {"name": {"type": "string", "minLength": 1, "maxLength": 100}, "round": ROUND}, required=("name",))
def run_probe(tb: Toolbox, name: str, round: int | None = None) -> dict[str, Any]:
    from evotrainer.diagnose import health_report

    index = tb.check_round(round)
    rows = list(tb.rollouts(index))
    history = tb.store.task_stats(tb.ws.domain or "", tb.run_id, index)
    with tb.repo.load(MAIN) as harness:  # the loop's own diagnose, in its sandbox worker
        report = health_report(harness, rows, task_stats=history)
    probe = report.get(name)
    if probe is None:
        raise ToolError(NOT_FOUND, f"main has no probe {name!r} (probes: {', '.join(p.name for p in report.probes)})")
    return {"round": index, "probe": name, "value": probe.value, "level": probe.level, "warn": probe.warn,
            "critical": probe.critical, "direction": probe.direction, "error": probe.error,
            "n_rollouts": report.n_rollouts, "examples": _examples(probe.examples, rows, tb)}


@tool("run_analysis", f"Run your own analysis code over a round's rollouts in the harness sandbox: define "
      f"`{ANALYSIS_FN}(rollouts, rewards) -> float | None`; examples are rollouts on which it alone passes threshold.",
      "analyse", {
          "code": {"type": "string", "minLength": 1, "maxLength": 20_000,
                   "description": "Python under the harness contract (evotrainer.api, numpy, pure stdlib)"},
          "round": ROUND,
          "threshold": {"type": "number", "description": "examples: rollouts whose own value passes it (default 0)"},
          "direction": {"type": "string", "enum": ["above", "below"], "description": "default above"}},
      required=("code",))
def run_analysis(tb: Toolbox, code: str, round: int | None = None, threshold: float = 0.0,
                 direction: str = "above") -> dict[str, Any]:
    index = tb.check_round(round)
    rows, rewards = _round_batch(tb, index)
    sources = tb.repo.sources(MAIN)
    # The agent's code becomes the diagnostics.py of a harness that is otherwise main's, so it
    # runs exactly where probes run: a sandbox worker, under the import guard and the OS sandbox.
    sources[DIAGNOSTICS] = code.rstrip("\n") + textwrap.dedent(f"""


        PROBES = [{{"name": "{ANALYSIS_PROBE}", "dimension": "result", "fn": {ANALYSIS_FN},
                   "warn": {float(threshold)!r}, "critical": {float(threshold)!r}, "direction": "{direction}"}}]
        """)
    rollouts = [_public(sr) for sr in rows]  # never an answer: the code is the agent's
    from evotrainer.diagnose.health import alert_examples

    try:
        with IsolatedHarness(sources, tb.repo.path) as harness:
            probe = harness.probes[0]
            value = probe.evaluate(rollouts, rewards)
            level = probe.level(value)
            ids = alert_examples(probe, rollouts, rewards) if level in ("warn", "critical") else ()
    except HarnessError as exc:
        from evotrainer.harness.redact import redact

        raise ToolError(FAILED, f"analysis failed in the sandbox: {redact(exc)}") from None
    return {"round": index, "value": value, "passes_threshold": level in ("warn", "critical"),
            "n_rollouts": len(rollouts), "examples": _examples(ids, rows, tb)}


# ---------------------------------------------------------------- candidates


def _this_round(tb: Toolbox, branch: str) -> str:
    prefix = f"{CANDIDATE_PREFIX}{tb.round}-"
    if not branch.startswith(prefix):
        raise ToolError(REFUSED, f"{branch!r} refused: only this round's candidate branches ({prefix}*)")
    if branch not in tb.repo.candidates():
        raise ToolError(NOT_FOUND, f"no candidate branch {branch!r} (this round's: "
                                   f"{', '.join(b for b in tb.repo.candidates() if b.startswith(prefix)) or 'none'})")
    return branch


def _protected(tb: Toolbox, base_sources: dict[str, str], edits: dict[str, str]) -> None:
    """The trusted probe the loop wrote into main's diagnostics.py (coevolve/loop.py,
    `_revise_diagnostics`) stays as the loop wrote it."""
    from evotrainer.coevolve.loop import FAILURE_PROBE
    from evotrainer.coevolve.probes import failure_reward_probe

    block = failure_reward_probe(FAILURE_PROBE)
    main = tb.repo.sources(MAIN).get(DIAGNOSTICS, "")
    if DIAGNOSTICS in edits and (block in main or block in base_sources.get(DIAGNOSTICS, "")) \
            and block not in edits[DIAGNOSTICS]:
        raise ToolError(REFUSED, f"{DIAGNOSTICS}: the trusted probe {FAILURE_PROBE} the loop added may not be "
                                 "changed or removed")


def _evidence_targets(tb: Toolbox, targets: str) -> str:
    """The metrics that judge the alert the candidate answers (diagnose/targets.py), from the
    round's health report where coevolve wrote one (diagnostics/<run>-round-<k>.json); without
    it, only a probe the agent names is widened to its metrics."""
    path = tb.ws.root / "diagnostics" / f"{tb.run}-round-{tb.round}.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        report = None
    return retarget(targets, report)


def _propose(tb: Toolbox, base: str, slug: str, edits: dict[str, str], diagnosis: str, targets: str,
             expected: str) -> dict[str, Any]:
    if not _SLUG.fullmatch(slug):
        raise ToolError(BAD_ARGUMENTS, f"slug {slug!r} must be lowercase words joined by '-'")
    if f"{CANDIDATE_PREFIX}{tb.round}-{slug}" in tb.repo.candidates():
        raise ToolError(BAD_ARGUMENTS, f"{CANDIDATE_PREFIX}{tb.round}-{slug} already exists; pick another slug")
    if not edits:
        raise ToolError(BAD_ARGUMENTS, "edits: a candidate needs at least one edited file")
    for name in edits:
        check_path(tb, name)
    base_sources = tb.repo.sources(base)
    _protected(tb, base_sources, edits)
    try:  # loaded in a sandbox worker before it becomes a branch, as every proposal is
        IsolatedHarness({**base_sources, **edits}, tb.repo.path).check()
    except HarnessError as exc:
        from evotrainer.harness.redact import redact

        raise ToolError(FAILED, f"the edited harness does not load: {redact(exc)}") from None
    try:
        cand = tb.repo.propose(tb.round, slug, edits, diagnosis=diagnosis, targets=_evidence_targets(tb, targets),
                               expected=expected, base=base)
    except HarnessRepoError as exc:
        raise ToolError(BAD_ARGUMENTS, str(exc)) from None
    return {"branch": cand.branch, "sha": cand.sha, "base": cand.base, "files": list(cand.files)}


@tool("write_candidate", "Write a candidate: edited harness files plus diagnosis, target metric and expected "
      "effect, committed on a new candidate branch from main.", "act",
      {"slug": SLUG, "edits": EDITS, "diagnosis": TEXT, "targets": TEXT, "expected": TEXT},
      required=("slug", "edits", "diagnosis", "targets", "expected"))
def write_candidate(tb: Toolbox, slug: str, edits: dict[str, str], diagnosis: str, targets: str,
                    expected: str) -> dict[str, Any]:
    return _propose(tb, MAIN, slug, edits, diagnosis, targets, expected)


@tool("revise_candidate", "Revise a candidate of this round: a new candidate branch from it with further edits.",
      "act", {"branch": BRANCH, "slug": SLUG, "edits": EDITS, "diagnosis": TEXT, "targets": TEXT, "expected": TEXT},
      required=("branch", "slug", "edits", "diagnosis", "targets", "expected"))
def revise_candidate(tb: Toolbox, branch: str, slug: str, edits: dict[str, str], diagnosis: str, targets: str,
                     expected: str) -> dict[str, Any]:
    return _propose(tb, _this_round(tb, branch), slug, edits, diagnosis, targets, expected)


@tool("backtest_candidate", "Backtest a candidate of this round against main on this round's rollouts; the "
      "gate's decision and reasons.", "act", {"branch": BRANCH}, required=("branch",))
def backtest_candidate(tb: Toolbox, branch: str) -> dict[str, Any]:
    from evotrainer.backtest import Selector, backtest
    from evotrainer.coevolve.heldout import HeldoutLeak, assert_no_heldout_rollouts

    _this_round(tb, branch)
    try:  # the candidate's code would see every replayed rollout: none may be held out
        assert_no_heldout_rollouts(tb.store, run_id=tb.run_id, round_index=tb.round)
    except HeldoutLeak as exc:
        raise ToolError(REFUSED, f"no backtest on round {tb.round}: {exc}") from None
    report = backtest(tb.ws.root, branch, selector=Selector(run=tb.run, round=tb.round), gate=tb.gate,
                      store=tb.store, workers=tb.workers, reuse=True)
    return {k: report.get(k) for k in ("id", "decision", "reasons", "target", "declared_target", "deltas",
                                       "metrics", "failure", "n_rollouts")}


@tool("submit_candidate", "Submit a candidate of this round to the loop (it does not promote; at most N a round).",
      "act", {"branch": BRANCH}, required=("branch",))
def submit_candidate(tb: Toolbox, branch: str) -> dict[str, Any]:
    _this_round(tb, branch)
    if read_done(tb.ws.root, tb.run, tb.round) is not None:  # the loop may have read them already
        raise ToolError(REFUSED, f"round {tb.round} is finished: no more submissions")
    path = submissions_path(tb.ws.root, tb.run, tb.round)
    done = read_submissions(tb.ws.root, tb.run, tb.round)
    if any(s["branch"] == branch for s in done):
        raise ToolError(BAD_ARGUMENTS, f"{branch} is already submitted")
    if len(done) >= tb.max_submissions:
        raise ToolError(SUBMIT_LIMIT, f"at most {tb.max_submissions} candidate(s) a round: already submitted "
                                      f"{', '.join(s['branch'] for s in done)}")
    head = tb.repo.log(rev=f"refs/heads/{branch}", limit=1)[0]
    done.append({"branch": branch, "sha": head.sha, "backtest": head.trailers.get("Backtest"),
                 "targets": head.trailers.get("Targets"),
                 "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    write_json(path, {"run": tb.run, "round": tb.round, "max": tb.max_submissions, "candidates": done}, indent=2)
    return {"submitted": [s["branch"] for s in done], "remaining": tb.max_submissions - len(done)}


@tool("finish_round", "Finish this round: the loop takes the submitted candidates (none is fine) to its own "
      "backtest and gate; no submission after this.", "act",
      {"note": {"type": "string", "maxLength": 2000, "description": "what you found, for the round's record"}})
def finish_round(tb: Toolbox, note: str = "") -> dict[str, Any]:
    done = read_done(tb.ws.root, tb.run, tb.round)
    if done is not None:
        raise ToolError(BAD_ARGUMENTS, f"round {tb.round} was already finished at {done['finished_at']} "
                                       f"({done['note'] or done['outcome']})")
    record = mark_done(tb.ws.root, tb.run, tb.round, note=note)
    return {"finished": True, "submitted": record["submitted"]}
