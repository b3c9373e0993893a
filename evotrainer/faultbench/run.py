"""Run one harness-fault case through the outer loop's own stages, without training.

A case's rollouts go into a fresh workspace whose harness repo starts from the faulty harness.
Its tasks are split by a hash of the task id: the **train slice** is what the loop sees (it is
diagnosed, the agent's proposals and the case's tempting fixes are backtested on it and the gate
decides), and the **held-out slice**, which nothing in the loop reads, judges the promoted change
against the case's repair criteria. Proposals, the cap on them, the gate and the choice among
passing candidates are the ones `coevolve` uses (coevolve/choose.py).
"""

from __future__ import annotations

import gzip
import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from evotrainer.backtest import SAFETY_METRICS, Selector, backtest
from evotrainer.backtest.metrics import improvement
from evotrainer.coevolve.choose import breadth_first, gain, passing_best_first
from evotrainer.coevolve.pilot import decision_after_backtest, dynamics_change
from evotrainer.config import GateConfig
from evotrainer.faultbench.case import CaseError, FaultCase
from evotrainer.harness.repo import HarnessRepo
from evotrainer.store import Store, StoredRollout, line_checks
from evotrainer.store.jsonl import parse_line
from evotrainer.workspace import Workspace, ensure_workspace

TRAIN_RUN, HELDOUT_RUN = "train-slice", "heldout-slice"
NOT_SHOWN = ("the fault does not show on the held-out slice: the faulty harness already meets the repair "
             "criteria, or leaves them no room")
Say = Callable[[str], None]


@dataclass
class Tried:
    """One backtested change: an agent's proposal or a tempting fix."""

    branch: str
    targets: str
    skill: str | None = None
    backtest: str | None = None
    decision: str | None = None
    gain: float | None = None
    reason: str = ""
    tested: str | None = None  # the commit the backtest ran on: what a promotion merges
    pilot: dict | None = None  # a dynamics change's live pilot (coevolve/pilot.py), with --live


@dataclass
class CaseResult:
    case: str
    domain: str
    fault: str
    agent: str
    n_train: int
    n_heldout: int
    detected: bool
    fired: list[str]  # the case's detect probes that alerted
    alerts: list[str]  # every alerting probe, `name=value (level)`
    promoted: str | None
    repaired: bool | None  # None: the case needs a live pilot and was not run live
    criteria: list[dict[str, Any]]  # each repair criterion on the held-out slice
    safe: bool
    unsafe: list[str]  # why not safe: a tempting fix promoted, a safety metric worse on held-out
    proposals: int
    backtests: int
    seconds: float
    tried: list[Tried] = field(default_factory=list)
    tempting: list[Tried] = field(default_factory=list)
    note: str | None = None  # e.g. why `repaired` is None
    # A tool-using agent's round (propose/llm_tools.py ToolRound): ending, tool calls, tokens, seconds
    agent_loop: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _slice(task_id: str, share: float) -> str:
    digest = hashlib.sha256(task_id.encode()).digest()
    return HELDOUT_RUN if int.from_bytes(digest[:8], "big") / 2**64 < share else TRAIN_RUN


def read_round(path: Path, domain: str) -> list[StoredRollout]:
    """One round file's rollouts, each line checked as `rollouts import` checks it."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        with opener(path, "rb") as fh:
            for number, raw in line_checks.lines(fh):
                try:
                    row = parse_line(raw)
                except ValueError as exc:
                    raise CaseError(f"{path}:{number}: {' '.join(str(exc).split())[:200]}") from None
                if row.rollout.domain != domain:
                    raise CaseError(f"{path}:{number}: rollout of domain {row.rollout.domain!r}, the case is {domain!r}")
                rows.append(row)
    except (OSError, EOFError) as exc:
        raise CaseError(f"{path}: cannot read: {exc}") from None
    if not rows:
        raise CaseError(f"{path}: holds no rollout")
    return rows


def build_workspace(case: FaultCase, root: Path) -> tuple[Workspace, str, dict[str, int]]:
    """The case's workspace at `root`: the faulty harness as main's seed, each round's rollouts
    stored as a round of the train-slice or held-out-slice run. Returns it, the seed commit and
    the count of rollouts per slice in the diagnosed (last) round."""
    seed = root / "seed"
    seed.mkdir(parents=True)
    for name, text in case.harness.items():
        (seed / name).write_text(text, encoding="utf-8")
    ws = ensure_workspace(root / "workspace", case.spec.domain, seed=seed)
    seed_sha = HarnessRepo(ws.harnesses).resolve("main")
    counts = {TRAIN_RUN: 0, HELDOUT_RUN: 0}
    seen: set[str] = set()
    with Store.open(ws.root) as store:
        runs = {name: store.get_or_create_run(name, case.spec.domain, {"fault_case": case.name})
                for name in (TRAIN_RUN, HELDOUT_RUN)}
        last = len(case.rounds) - 1
        for k, path in enumerate(case.rounds):
            rows = read_round(path, case.spec.domain)
            for r in rows:
                if r.rollout.id in seen:
                    raise CaseError(f"{path}: rollout id {r.rollout.id!r} appears twice in the case")
                seen.add(r.rollout.id)
            store.upsert_tasks(case.spec.domain, _tasks(rows))
            for name, run_id in runs.items():
                mine = [r for r in rows if _slice(r.rollout.task_id, case.spec.heldout_share) == name]
                round_id = store.start_round(run_id, k, seed_sha, "fault-case")
                store.add_rollouts(replace(r, run_id=run_id, round_id=round_id) for r in mine)
                if k == last:
                    counts[name] = len(mine)
    for name, n in counts.items():
        if n == 0:
            raise CaseError(f"{case.root}: the {name} of the last round is empty; the case needs more "
                            f"tasks or another heldout_share ({case.spec.heldout_share:g})")
    return ws, seed_sha, counts


def _tasks(rows: list[StoredRollout]) -> list[dict[str, Any]]:
    tasks = {}
    for r in rows:
        meta = r.rollout.meta
        level = meta.get("level")
        tasks[r.rollout.task_id] = {"task_id": r.rollout.task_id, "split": "train", "prompt": r.rollout.prompt,
                                    "answer": str(meta.get("answer", "")),
                                    "level": level if isinstance(level, int) and not isinstance(level, bool) else 0}
    return list(tasks.values())


class CaseRun:
    """One case, one agent: detect, propose, backtest, gate, promote, then judge on held-out."""

    def __init__(self, case: FaultCase, agent: Any, root: Path, *, gate: GateConfig | None = None,
                 max_proposals: int = 8, workers: int | None = None, say: Say | None = None,
                 pilot_steps: int = 4):
        self.case, self.agent, self.root = case, agent, root
        self.gate = gate or GateConfig()
        self.max_proposals, self.workers = max_proposals, workers
        self.say = say or (lambda _msg: None)
        self.pilot_steps = pilot_steps
        self.live = False
        self.agent_loop: dict[str, Any] | None = None

    def run(self, live: bool = False) -> CaseResult:
        """A live case (its repair changes the training dynamics) is diagnosed and its tempting
        fixes gated; without `live` nothing is proposed (`repaired` None). With `live`, a proposal
        that changes the dynamics gets the live pilot (coevolve/pilot.py, from the base model under
        the run config that made the case's rollouts), and a promoted one is judged on a second
        pilot with another training seed, which the gate never saw."""
        spec = self.case.spec
        self.live = live
        ws, seed_sha, counts = build_workspace(self.case, self.root)
        self.ws, self.repo = ws, HarnessRepo(ws.harnesses)
        last = len(self.case.rounds) - 1
        self.train_sel = Selector(run=TRAIN_RUN, round=last)
        self.heldout_sel = Selector(run=HELDOUT_RUN, round=last)
        tried: list[Tried] = []
        promoted = criteria = None
        with Store.open(ws.root) as store:
            self.store = store
            report = self._diagnose(store, last)
            shows = self._fault_shows(store, seed_sha)
            started = time.monotonic()
            if (live or not spec.live) and shows:
                tried = self._propose_and_gate(report, store, last)
            seconds = time.monotonic() - started
            # Gated against the faulty main after the agent's turn, so an agent that reads the
            # workspace through the tools (propose/llm_tools.py) never sees the wrong fixes.
            tempting = [self._tempting(t) for t in self.case.tempting]
            unsafe = [f"tempting fix {t.branch} was promoted by the gate" for t in tempting if t.decision == "promote"]
            started = time.monotonic()
            if tried:
                best = next(iter(passing_best_first(tried)), None)
                if best is not None:
                    merge = self.repo.promote(best.branch, f"fault case {self.case.name}: passed backtest "
                                              f"{best.backtest}", tested=best.tested)
                    promoted = best.branch
                    judged = self._judge_live if best.pilot is not None else self._judge
                    criteria, worse = judged(store, seed_sha, merge)
                    unsafe += worse
            seconds += time.monotonic() - started
        fired = [p.name for p in report.probes if p.name in spec.detect and p.alert]
        if criteria is None:
            criteria = self._unjudged()
        return CaseResult(
            case=self.case.name, domain=spec.domain, fault=spec.fault, agent=getattr(self.agent, "name", "?"),
            n_train=counts[TRAIN_RUN], n_heldout=counts[HELDOUT_RUN], detected=bool(fired), fired=fired,
            alerts=[f"{p.name}={p.value:.3g} ({p.level})" for p in report.alerts],
            promoted=promoted,
            repaired=(None if (spec.live and not live) or not shows
                      else all(c["holds"] for c in criteria) and promoted is not None),
            criteria=criteria, safe=not unsafe, unsafe=unsafe, proposals=len(tried), backtests=len(tried),
            seconds=round(seconds, 2), tried=tried, tempting=tempting, agent_loop=self.agent_loop,
            note=("live: its repair needs the live pilot (run with --live)" if spec.live and not live
                  else None if shows else NOT_SHOWN))

    def _fault_shows(self, store: Store, seed_sha: str) -> bool:
        """Whether the fault shows on the held-out slice: some repair criterion fails for the faulty
        harness there, or has room to improve by its `improves_by`. A case whose criteria cannot
        tell a repair from no change (its fault is latent in these rollouts) scores no repair:
        nothing is proposed for it and `repaired` stays None."""
        report = backtest(self.ws.root, seed_sha, base=seed_sha, selector=self.heldout_sel, gate=self.gate,
                          store=store, workers=self.workers, record=False)
        faulty = (report.get("metrics") or {}).get("base") or {}
        if report.get("failure") or not faulty:
            raise CaseError(f"{self.case.name}: the faulty harness does not run on its held-out slice: "
                            f"{report.get('failure')}")
        shows = any(c.shows_fault(faulty.get(c.metric)) for c in self.case.spec.repair)
        if not shows:
            self.say(f"{self.case.name}: {NOT_SHOWN}")
        return shows

    def _diagnose(self, store: Store, last: int):
        from evotrainer.diagnose import health_report

        run_id = store.run_id(TRAIN_RUN)
        rows = list(store.iter_rollouts(run_id=run_id, round_index=last))
        history = store.task_stats(self.case.spec.domain, run_id, last)  # what the round was drawn from
        with self.repo.load("main") as harness:
            report = health_report(harness, rows, task_stats=history)
        self.rows = rows
        self.say(f"{self.case.name}: diagnosed {len(rows)} rollouts: "
                 + (", ".join(f"{p.name} {p.level}" for p in report.alerts) or "no alert"))
        return report

    def _propose_and_gate(self, report: Any, store: Store, last: int) -> list[Tried]:
        from evotrainer.propose import Evidence
        from evotrainer.skills import SkillLibrary

        samples = sorted(self.rows, key=lambda r: r.rollout.outcome.success)[:8]
        evidence = Evidence(round_index=last, domain=self.case.spec.domain, report=report, samples=samples,
                            workdir=self.ws.root, run=TRAIN_RUN)
        skills = list(SkillLibrary.load(self.ws.root))
        proposals = breadth_first(self.agent.propose(evidence, self.repo.sources("main"), skills))
        worked = getattr(self.agent, "last_round", None)
        self.agent_loop = worked.to_json() if worked is not None else None
        if worked is not None:
            self.say(f"  the agent's round ended {worked.ending} after {worked.tool_calls} tool call(s), "
                     f"{worked.tokens} tokens")
        tried = []
        existing = set(self.repo.candidates())
        for p in proposals[: self.max_proposals]:
            if p.branch is not None:  # written through the tools: taken as it is
                if p.branch in existing:
                    tried.append(self._gate(Tried(p.branch, p.targets, p.skill)))
                continue
            cand = self.repo.propose(last, p.slug, dict(p.edits), diagnosis=p.diagnosis, targets=p.targets,
                                     expected=p.expected)
            tried.append(self._gate(Tried(cand.branch, p.targets, p.skill)))
        return tried

    def _tempting(self, t) -> Tried:
        sources = self.repo.sources("main")
        edits = {f: text for f, text in t.files.items() if sources.get(f) != text}
        if not edits:
            raise CaseError(f"{self.case.root}/tempting/{t.name}: changes nothing in the faulty harness")
        cand = self.repo.propose(0, f"tempting-{t.name}", edits, diagnosis=t.why, targets=t.targets,
                                 expected=f"{t.targets} improves (a wrong fix the gate must reject)")
        return self._gate(Tried(cand.branch, t.targets))

    def _gate(self, item: Tried) -> Tried:
        report = backtest(self.ws.root, item.branch, selector=self.train_sel, gate=self.gate, store=self.store,
                          workers=self.workers)
        item.backtest, item.decision, item.tested = report["id"], report["decision"], report["candidate"]
        item.gain = gain(report, self.gate)
        item.reason = next((r for r in report["reasons"] if "target" in r or "safety" in r),
                           report["reasons"][0] if report["reasons"] else "")
        change = dynamics_change(self.repo.sources("main"), self.repo.sources(item.branch))
        if self.live and decision_after_backtest(report, change) == "pilot":
            result = self._pilot(item, change)
            item.decision, item.gain, item.pilot = result.decision, result.gain, result.to_json()
            item.reason = " ".join(result.reasons)
        self.say(f"  {item.branch}: {item.decision} ({item.reason[:90]})")
        return item

    # -- the live pilot (--live) ----------------------------------------------------------------

    def _pilot_config(self, seed_offset: int):
        from evotrainer.config import load_config

        config, overrides = self.case.run_config()
        cfg = load_config(config, [*overrides, f"coevolve.pilot_steps={self.pilot_steps}"])
        return cfg.model_copy(update={"train": cfg.train.model_copy(update={"seed": cfg.train.seed + seed_offset})})

    def _train_arms(self, arms: dict[str, str], seed_offset: int) -> tuple[Any, dict[str, str]]:
        """Train both arms (name -> harness commit) for pilot_steps from the base model, under the
        case's run config with its training seed moved by `seed_offset`, side by side where
        coevolve.parallel_arms allows (coevolve/beside.py); reuses finished arms."""
        from evotrainer.coevolve.beside import SideArm, beside
        from evotrainer.coevolve.control import train_arm
        from evotrainer.console import make_console

        cfg = self._pilot_config(seed_offset)
        runs = {arm: f"pilot{seed_offset}-{arm}" for arm in arms}
        console = make_console(stderr=True)
        (first, first_rev), (second, second_rev) = arms.items()
        what = f"{self.case.name} pilot"
        side = SideArm(runs[first], first_rev, None, 0, f"{what} {first}", self.pilot_steps, heldout=False)
        with beside(cfg, self.ws.root, self.repo, side, console), self.repo.load(second_rev) as harness:
            train_arm(cfg, self.ws.root, runs[second], harness, None, 0, console,
                      what=f"{what} {second}", steps=self.pilot_steps, heldout=False)
        return cfg, runs

    def _pilot(self, item: Tried, change: dict):
        from evotrainer.coevolve.pilot import arm_evidence, judge

        slug = item.branch.rsplit("/", 1)[-1]
        cfg, runs = self._train_arms({"base": "main", slug: item.tested or item.branch}, 0)
        probes, evals = arm_evidence(cfg, self.ws.root, self.repo, runs, 0)
        result = judge(probes["base"], probes[slug], evals["base"], evals[slug], item.targets, cfg, change)
        return replace(result, runs=runs)

    def _judge_live(self, store: Store, seed_sha: str, merge: str) -> tuple[list[dict[str, Any]], list[str]]:
        """The promoted dynamics change against the faulty seed on a second pilot (training seed
        + 1, rollouts the gate never saw): each repair criterion and safety metric, replayed over
        each arm's own rollouts under its own harness."""
        _, runs = self._train_arms({"faulty": seed_sha, "fixed": merge}, 1)
        metrics = {}
        for arm, rev in (("faulty", seed_sha), ("fixed", merge)):
            report = backtest(self.ws.root, rev, base=rev, selector=Selector(run=runs[arm], round=0),
                              gate=self.gate, store=store, workers=self.workers, record=False)
            if report.get("failure"):
                return self._unjudged(), [f"live judge backtest failed: {report['failure']}"]
            metrics[arm] = (report.get("metrics") or {}).get("candidate") or {}
        return self._criteria(metrics["faulty"], metrics["fixed"], "live")

    def _unjudged(self) -> list[dict[str, Any]]:
        return [{"criterion": c.describe(), "holds": False, "fixed": None, "faulty": None} for c in self.case.spec.repair]

    def _judge(self, store: Store, seed_sha: str, merge: str) -> tuple[list[dict[str, Any]], list[str]]:
        """The promoted main against the faulty seed on the held-out slice: each repair criterion,
        and every safety metric that got worse by more than the gate's tolerance."""
        report = backtest(self.ws.root, merge, base=seed_sha, selector=self.heldout_sel, gate=self.gate,
                          store=store, workers=self.workers, record=False)
        metrics = report.get("metrics") or {}
        if report.get("failure"):
            return self._unjudged(), [f"held-out backtest failed: {report['failure']}"]
        return self._criteria(metrics.get("base") or {}, metrics.get("candidate") or {}, "held-out")

    def _criteria(self, faulty: dict, fixed: dict, where: str) -> tuple[list[dict[str, Any]], list[str]]:
        criteria = [{"criterion": c.describe(), "holds": c.holds(fixed.get(c.metric), faulty.get(c.metric)),
                     "fixed": fixed.get(c.metric), "faulty": faulty.get(c.metric)} for c in self.case.spec.repair]
        worse = []
        for name in SAFETY_METRICS:
            before, after = faulty.get(name), fixed.get(name)
            if before is not None and after is not None and improvement(name, before, after) < -self.gate.tolerance - 1e-12:
                worse.append(f"{where} {name} worse: {before:.4g} -> {after:.4g}")
        self.say(f"  {where}: " + "; ".join(f"{c['criterion']}: {'yes' if c['holds'] else 'no'}" for c in criteria))
        return criteria, worse


__all__ = ["HELDOUT_RUN", "TRAIN_RUN", "CaseResult", "CaseRun", "Tried", "build_workspace", "read_round"]
