"""Read tools: the run's rollouts, per-task history, health reports, backtests, lineage, skills, harness files.

All of them read; none writes. Rollouts of held-out or validation tasks never appear, and
rollout meta loses the keys that carry answers (surface.SECRET_META).
"""

from __future__ import annotations

import json
import re
from typing import Any

from evotrainer.harness.repo import CANDIDATE_PREFIX, MAIN, HarnessRepoError, allowed_file
from evotrainer.store import StoredRollout
from evotrainer.tools.registry import NOT_FOUND, REFUSED, ToolError, tool
from evotrainer.tools.surface import Toolbox, bad, public_meta

PREVIEW_CHARS = 200
MAX_TEXT = 20_000  # per message of a shown rollout
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.~-]{0,199}")
KINDS = ["ok", "wrong", "format_error", "empty", "truncated", "timeout", "patch_failed", "tampering", "error"]

ROUND = {"type": "integer", "minimum": 0, "description": "round index (default: this round)"}
LIMIT = {"type": "integer", "minimum": 1, "maximum": 100, "description": "at most this many items (default 20)"}
OFFSET = {"type": "integer", "minimum": 0, "description": "skip this many matches first (default 0)"}
REV = {"type": "string", "minLength": 1, "maxLength": 200,
       "description": "main, a candidate branch or a commit sha (default main)"}


def _text(text: str, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} characters cut ...]"


def _preview(sr: StoredRollout) -> str:
    r = sr.rollout
    text = r.completion if r.completion.strip() or not r.turns else r.turns[-1].content
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def summary(sr: StoredRollout, rounds: dict[int, int]) -> dict[str, Any]:
    r = sr.rollout
    return {"id": r.id, "round": rounds.get(sr.round_id) if sr.round_id is not None else None, "step": sr.step,
            "task_id": r.task_id, "group_id": r.group_id, "kind": r.outcome.kind, "success": r.outcome.success,
            "flags": list(r.outcome.flags), "reward": sr.reward, "kept": sr.kept, "num_tokens": r.num_tokens,
            "truncated": r.truncated, "turns": len(r.turns), "preview": _preview(sr)}


@tool("list_rollouts", "List the run's rollouts, filtered and paginated (held-out and validation tasks never appear).",
      "read", {
          "round": ROUND,
          "all_rounds": {"type": "boolean", "description": "every round of the run, not one (default false)"},
          "kind": {"type": "string", "enum": KINDS, "description": "outcome kind"},
          "success": {"type": "boolean", "description": "verified success"},
          "min_reward": {"type": "number", "description": "stored training reward >= this"},
          "max_reward": {"type": "number", "description": "stored training reward <= this"},
          "kept": {"type": "boolean", "description": "kept by the filters in training"},
          "task_id": {"type": "string", "maxLength": 200},
          "text": {"type": "string", "minLength": 1, "maxLength": 200,
                   "description": "substring of the completion or of any turn (case-insensitive)"},
          "offset": OFFSET, "limit": LIMIT})
def list_rollouts(tb: Toolbox, round: int | None = None, all_rounds: bool = False, kind: str | None = None,
                  success: bool | None = None, min_reward: float | None = None, max_reward: float | None = None,
                  kept: bool | None = None, task_id: str | None = None, text: str | None = None,
                  offset: int = 0, limit: int = 20) -> dict[str, Any]:
    index = None if all_rounds else tb.check_round(round)
    needle = text.lower() if text else None

    def match(sr: StoredRollout) -> bool:
        r = sr.rollout
        if (success is not None and r.outcome.success != success) or (kept is not None and sr.kept != kept):
            return False
        if task_id is not None and r.task_id != task_id:
            return False
        if min_reward is not None and (sr.reward is None or sr.reward < min_reward):
            return False
        if max_reward is not None and (sr.reward is None or sr.reward > max_reward):
            return False
        if needle is not None:
            return needle in r.completion.lower() or any(needle in t.content.lower() for t in r.turns)
        return True

    rounds = tb.round_ids()
    total, page = 0, []
    for sr in tb.rollouts(index, kind):
        if match(sr):
            if offset <= total < offset + limit:
                page.append(summary(sr, rounds))
            total += 1
    nxt = offset + limit if offset + limit < total else None
    return {"round": index, "total": total, "offset": offset, "limit": limit, "next_offset": nxt, "rollouts": page}


@tool("show_rollout", "Show one rollout in full: prompt, completion, every turn, outcome, rewards, kept flag.",
      "read", {"id": {"type": "string", "minLength": 1, "maxLength": 200, "description": "rollout id or unique prefix"}},
      required=("id",))
def show_rollout(tb: Toolbox, id: str) -> dict[str, Any]:
    try:
        sr = tb.store.get_rollout(id)
    except ValueError as exc:  # an ambiguous prefix
        raise bad(str(exc)) from None
    if sr is None or sr.run_id != tb.run_id:
        raise ToolError(NOT_FOUND, f"no rollout {id!r} in run {tb.run!r}")
    if tb.hidden(sr):
        # Only what the caller typed comes back: the hidden rollout's full id is not shown either.
        raise ToolError(REFUSED, f"rollout {id!r} is of a held-out or validation task: never shown")
    r = sr.rollout
    return {**summary(sr, tb.round_ids()), "preview": None, "prompt": _text(r.prompt, MAX_TEXT),
            "completion": _text(r.completion, MAX_TEXT),
            "messages": [{"role": t.role, "content": _text(t.content, MAX_TEXT)} for t in r.turns],
            "outcome": {"success": r.outcome.success, "score": r.outcome.score, "kind": r.outcome.kind,
                        "flags": list(r.outcome.flags)},
            "reward_components": sr.reward_components, "advantage": sr.advantage,
            "harness_version": sr.harness_version, "model_version": sr.model_version,
            "meta": json.loads(json.dumps(public_meta(r.meta), default=str))}


@tool("task_history", "Attempts and verified successes per task and round (train tasks only).", "read", {
    "task_id": {"type": "string", "minLength": 1, "maxLength": 200, "description": "one task (default: all)"},
    "offset": OFFSET, "limit": LIMIT})
def task_history(tb: Toolbox, task_id: str | None = None, offset: int = 0, limit: int = 20) -> dict[str, Any]:
    per_task: dict[str, list[dict[str, Any]]] = {}
    for index in sorted(tb.round_ids().values()):
        for tid, (n, k) in sorted(tb.store.round_counts(tb.run_id, index).items()):
            if task_id is None or tid == task_id:
                per_task.setdefault(tid, []).append({"round": index, "attempts": n, "successes": k})
    hidden = _hidden_task_ids(tb)
    tasks = [t for t in sorted(per_task) if t not in hidden]
    if task_id is not None and task_id in hidden:
        raise ToolError(REFUSED, f"task {task_id!r} is a held-out or validation task: its history is not shown")
    if task_id is not None and not tasks:
        raise ToolError(NOT_FOUND, f"task {task_id!r} has no rollout in run {tb.run!r}")
    page = tasks[offset: offset + limit]
    return {"total": len(tasks), "offset": offset, "limit": limit,
            "next_offset": offset + limit if offset + limit < len(tasks) else None,
            "tasks": [{"task_id": t, "attempts": sum(h["attempts"] for h in per_task[t]),
                       "successes": sum(h["successes"] for h in per_task[t]), "rounds": per_task[t]} for t in page]}


def _hidden_task_ids(tb: Toolbox) -> set[str]:
    ids = {task for split in ("heldout", "validation") for _, task in tb.store.task_keys(split)}
    ids |= {sr.rollout.task_id for sr in tb.store.iter_rollouts(run_id=tb.run_id) if tb.hidden(sr)}
    return ids


@tool("health_report", "The health report of a round: every probe's value and level, alerts, example rollouts.",
      "read", {"round": ROUND})
def health_report(tb: Toolbox, round: int | None = None) -> dict[str, Any]:
    index = tb.check_round(round)
    saved = tb.ws.root / "diagnostics" / f"{tb.run}-round-{index}.json"
    if saved.is_file():  # what the loop's diagnose stage wrote, trusted probes included
        return {"round": index, "source": "diagnose stage", **json.loads(saved.read_text(encoding="utf-8"))}
    from evotrainer.diagnose import health_report as compute

    rows = list(tb.rollouts(index))
    history = tb.store.task_stats(tb.ws.domain or "", tb.run_id, index)
    with tb.repo.load(MAIN) as harness:
        report = compute(harness, rows, task_stats=history)
    return {"round": index, "source": "computed now with main", **report.to_json()}


@tool("list_backtests", "Earlier backtest reports of this workspace, newest first.", "read", {"limit": LIMIT})
def list_backtests(tb: Toolbox, limit: int = 20) -> dict[str, Any]:
    return {"backtests": [{k: b[k] for k in ("id", "created_at", "candidate_rev", "candidate", "decision",
                                             "target", "n_rollouts")} for b in tb.store.backtests(limit)]}


@tool("show_backtest", "One backtest report: metrics of base and candidate, deltas, the gate's decision and reasons.",
      "read", {"id": {"type": "string", "minLength": 1, "maxLength": 200}}, required=("id",))
def show_backtest(tb: Toolbox, id: str) -> dict[str, Any]:
    from evotrainer.backtest import load_report

    if not _ID.fullmatch(id) or ".." in id:
        raise ToolError(REFUSED, f"backtest id {id!r} refused: letters, digits, '.', '_' and '-' only")
    try:
        report = load_report(tb.ws.backtests, id, tb.store)
    except Exception as exc:  # an unknown or ambiguous id
        raise ToolError(NOT_FOUND, f"backtest {id!r}: {exc}") from None
    report = dict(report)
    ids = report.pop("rollout_ids", None)
    if ids is not None:
        report["n_rollout_ids"] = len(ids)
    return report


@tool("lineage", "The harness lineage: main's commits with their trailers, and each promotion's live verification.",
      "read", {"limit": LIMIT})
def lineage(tb: Toolbox, limit: int = 20) -> dict[str, Any]:
    from evotrainer.coevolve.state import RunState

    state = RunState.load(tb.ws.root / "coevolve.json")
    verified: dict[str, list[dict[str, Any]]] = {}
    for summary_ in (state.history if state is not None and state.run == tb.run else []):
        v = summary_.get("verified")
        if v and v.get("branch"):
            verified.setdefault(v["branch"], []).append({"round": summary_["round"], "kept": v.get("kept"),
                                                         "describe": v.get("describe")})
    commits = []
    for c in tb.repo.log(first_parent=True, limit=limit):
        branch = c.trailers.get("Candidate")
        commits.append({"sha": c.sha, "date": c.date.isoformat(), "subject": c.subject, "trailers": c.trailers,
                        "kind": ("revert" if "Reverts" in c.trailers else "promotion" if c.is_merge else "commit"),
                        "verification": verified.get(branch) if branch and "Reverts" not in c.trailers else None})
    pending = state.pending.branch if state is not None and state.pending is not None else None
    return {"main": tb.repo.resolve(MAIN), "commits": commits, "pending_verification": pending,
            "candidates": [b for b in tb.repo.candidates() if b.startswith(f"{CANDIDATE_PREFIX}{tb.round}-")]}


@tool("list_skills", "The skill library: shipped and learned skills with trigger, target and status.", "read", {
    "domain": {"type": "string", "maxLength": 100},
    "status": {"type": "string", "maxLength": 40}})
def list_skills(tb: Toolbox, domain: str | None = None, status: str | None = None) -> dict[str, Any]:
    from evotrainer.skills import SkillLibrary

    skills = SkillLibrary.load(tb.ws.root).filter(domain=domain, status=status)
    return {"skills": [{"name": s.name, "summary": s.summary, "status": s.status, "source": s.source,
                        "targets": s.targets, "domains": list(s.domains),
                        "trigger": [t.describe() for t in s.triggers]} for s in skills]}


@tool("show_skill", "One skill in full: trigger, intervention, grid, expected effect, evidence, README, templates.",
      "read", {"name": {"type": "string", "minLength": 1, "maxLength": 100}}, required=("name",))
def show_skill(tb: Toolbox, name: str) -> dict[str, Any]:
    from evotrainer.skills import SkillLibrary

    library = SkillLibrary.load(tb.ws.root)
    if name not in library:
        raise ToolError(NOT_FOUND, f"no skill {name!r}")
    skill = library.get(name)
    return {**json.loads(json.dumps(skill.to_yaml(), default=str)), "source": skill.source, "readme": skill.readme,
            "templates": dict(skill.templates)}


@tool("list_harness_files", "The harness files at a revision, with their sizes in lines.", "read", {"rev": REV})
def list_harness_files(tb: Toolbox, rev: str = MAIN) -> dict[str, Any]:
    sources = _sources(tb, rev)
    return {"rev": rev, "sha": tb.repo.resolve(rev), "files": {n: len(t.splitlines()) for n, t in sources.items()}}


@tool("read_harness_file", "The text of one harness file at a revision (a file at the harness repo's root).", "read",
      {"name": {"type": "string", "minLength": 1, "maxLength": 200}, "rev": REV}, required=("name",))
def read_harness_file(tb: Toolbox, name: str, rev: str = MAIN) -> dict[str, Any]:
    check_path(tb, name)
    sources = _sources(tb, rev)
    if name not in sources:
        raise ToolError(NOT_FOUND, f"no harness file {name!r} at {rev} (files: {', '.join(sorted(sources))})")
    return {"name": name, "rev": rev, "text": sources[name]}


def _sources(tb: Toolbox, rev: str) -> dict[str, str]:
    try:
        return tb.repo.sources(rev)
    except HarnessRepoError as exc:
        raise ToolError(NOT_FOUND, str(exc)) from None


def check_path(tb: Toolbox, name: str) -> str:
    """A plain file at the harness repo's root: no '..', no absolute path, no folder, no hidden file,
    no symlink (in the working tree or in main's tree). Anything else is refused."""
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise ToolError(REFUSED, f"path {name!r} refused: an absolute path, outside the harness repo")
    if "/" in name or "\\" in name or ".." in name:
        raise ToolError(REFUSED, f"path {name!r} refused: only files at the harness repo's root")
    if not allowed_file(name):
        raise ToolError(REFUSED, f"path {name!r} refused: not a harness file (reward.py, filters.py, ... or a new "
                                 "*.py, *.yaml, *.j2, *.md at the root)")
    tree = tb.repo.repo.commit(tb.repo.resolve(MAIN)).tree
    if (tb.repo.path / name).is_symlink() or (name in tree and tree[name].mode == 0o120000):
        raise ToolError(REFUSED, f"path {name!r} refused: a symlink in the harness repo")
    return name
