"""The live pilot: a few training steps judge what replay cannot.

A backtest replays rewards, filters and curricula over stored rollouts. A change to the training
dynamics (a harness.yaml `grpo` knob: learning rate, KL weight, clip range, sampling temperature,
number of generations, completion length, LoRA shape) leaves every replayed number as it was, so
the gate can neither pass nor fail it on its merits. Such a candidate (`dynamics_change`) whose
backtest fails nothing but its target gets a pilot instead: from the round's adapter, with the
main run's seed and task history, `coevolve.pilot_steps` steps are trained twice, under main
(`<run>~pilot-base`) and under the candidate (`<run>~pilot-<slug>`), both as round k+1 of their
own runs in the same store, and each arm is evaluated on the validation split only. The two arms
train side by side where coevolve.parallel_arms allows (coevolve/beside.py).

The candidate passes when (1) the probe its Targets name, measured by main's diagnostics on each
arm's training rollouts, improves by at least the gate's margin, and (2) validation success does
not regress against the base arm beyond `coevolve.verify_z` paired standard errors. The pilot
arms train nothing the main run keeps: a promoted change is then trained and verified like any
other. Both arms' rows stay in the store, so the evidence can be read back (`evotrainer report`).

Every arm's steps are audited like any training step (train/audit.py): a candidate whose live
values a fresh replay does not reproduce is rejected ("failed: audit: ..."), its arm stopped.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from evotrainer.coevolve.beside import SideArm, beside
from evotrainer.coevolve.control import train_arm
from evotrainer.coevolve.verify import verify_paired
from evotrainer.config import Config
from evotrainer.diagnose.health import FALSE_DROP
from evotrainer.harness.errors import HarnessError
from evotrainer.harness.loader import prompt_template
from evotrainer.harness.repo import HarnessRepo
from evotrainer.harness.spec import parse_spec
from evotrainer.store import Store
from evotrainer.train.audit import AuditFailure

# Paired with a filters.py edit the backtest does replay (skills/mask-truncated).
REPLAYED_KNOBS = frozenset({"mask_truncated_completions"})


def dynamics_change(base: Mapping[str, str], candidate: Mapping[str, str]) -> dict[str, list]:
    """What replay cannot judge: the grpo knobs the candidate's harness.yaml sets differently,
    {knob: [base, candidate]}, and a changed rollout.py PROMPT, {"PROMPT": [sha, sha]} (the
    prompt is what the policy is asked, in training and evaluation alike; a backtest never reads it)."""
    old = parse_spec(base.get("harness.yaml", "")).grpo
    new = parse_spec(candidate.get("harness.yaml", "")).grpo
    change = {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new))
              if k not in REPLAYED_KNOBS and old.get(k) != new.get(k)}
    prompts = [_prompt_digest(s.get("rollout.py", "")) for s in (base, candidate)]
    if prompts[0] != prompts[1]:
        change[PROMPT_KEY] = prompts
    return change


PROMPT_KEY = "PROMPT"


def _prompt_digest(source: str) -> str:
    """A short digest of rollout.py's PROMPT text (the text itself is candidate-written: it stays out
    of reasons and the terminal); a rollout.py whose PROMPT cannot be read digests its whole text."""
    try:
        text = prompt_template(source)
    except HarnessError:
        text = "\0unreadable\0" + source
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def needs_pilot(report: Mapping[str, Any], change: Mapping[str, Any]) -> bool:
    """A dynamics change whose backtest failed no check but its target (which replay cannot move).
    A backtest that passed counts too: a dynamics or PROMPT change that rides along with a
    gate-passing edit is still never promoted on replay alone."""
    failed = [c["name"] for c in report.get("checks") or [] if not c["passed"]]
    return bool(change) and bool(report.get("checks")) and all(n.startswith("target") for n in failed)


def decision_after_backtest(report: Mapping[str, Any], change: Mapping[str, Any]) -> str:
    """The backtest's decision, or "pilot" for a dynamics or PROMPT change whose backtest failed
    nothing but its target: such a change is judged by training, never promoted on replay alone."""
    decision = str(report.get("decision"))
    return "pilot" if decision in ("reject", "promote") and needs_pilot(report, change) else decision


NO_PROBE = "its Targets ({targets!r}) name no probe of main's diagnostics, so a pilot cannot tell whether it fixed anything"


def target_probe(targets: str, probes: Collection[str]) -> str | None:
    """The first word of a candidate's Targets that names one of `probes`: what its pilot judges."""
    return next((w for w in re.findall(r"[A-Za-z_]+", targets or "") if w in probes), None)


def describe_change(change: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in change.items())


def pilot_run(run_name: str, arm: str) -> str:
    return f"{run_name}~pilot-{arm}"


@dataclass(frozen=True)
class PilotResult:
    decision: str  # promote | reject
    reasons: list[str]
    target: str | None
    base: float | None  # the target probe on the base arm's rollouts
    candidate: float | None
    validation: str  # the paired verdict on the validation split
    gain: float | None  # the target's improvement in gate margins
    change: dict
    runs: dict = field(default_factory=dict)  # arm -> the run its rows are stored under

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_pilot(config: Config, root: Path, repo: HarnessRepo, *, branch: str, slug: str, targets: str,
              round_index: int, change: Mapping[str, Any], console: Console) -> PilotResult:
    """Train (or reuse) both arms and judge the candidate; see the module doc."""
    steps = config.coevolve.pilot_steps
    index = round_index + 1
    with repo.load("main") as harness:
        measured = {p.name for p in harness.probes} | {FALSE_DROP}
    if target_probe(targets, measured) is None:  # judged before training: the arms would be wasted
        return PilotResult("reject", [f"pilot ({describe_change(change)}): not trained: {NO_PROBE.format(targets=targets)}"],
                           None, None, None, "", None, dict(change))
    base = SideArm(pilot_run(config.run_name, "base"), "main", round_index, index, "pilot base", steps, heldout=False)
    try:
        with beside(config, root, repo, base, console), repo.load(branch) as harness:  # the arms side by side
            train_arm(config, root, pilot_run(config.run_name, slug), harness, round_index, index, console,
                      what=f"pilot {slug}", steps=steps, heldout=False)
    except AuditFailure as failure:  # the candidate's arm: its live values are not its replayed ones
        if failure.version != repo.resolve(branch):
            raise
        return PilotResult("reject", [f"pilot ({describe_change(change)}): failed: {failure}"],
                           None, None, None, "", None, dict(change), {slug: pilot_run(config.run_name, slug)})
    runs = {"base": base.run_name, slug: pilot_run(config.run_name, slug)}
    probes, evals = arm_evidence(config, root, repo, runs, index)
    result = judge(probes["base"], probes[slug], evals["base"], evals[slug], targets, config, dict(change))
    return replace(result, runs=runs)


def arm_evidence(config: Config, root: Path, repo: HarnessRepo, runs: Mapping[str, str],
                 index: int) -> tuple[dict[str, dict], dict[str, list]]:
    """Each arm's probes (main's diagnostics over its round-`index` training rollouts: one probe
    code measures every arm) and its validation evals; `runs`: arm -> run name."""
    from evotrainer.diagnose import health_report

    with Store.open(root, config.store.url) as store:
        evals, rows = {}, {}
        for arm, run_name in runs.items():
            run_id = store.run_id(run_name)
            evals[arm] = [e for e in store.evals(run_id) if e["split"] == "validation" and e["round_index"] == index]
            rows[arm] = list(store.iter_rollouts(run_id=run_id, round_index=index))
    with repo.load("main") as harness:
        probes = {arm: {p.name: p for p in health_report(harness, arm_rows).probes} for arm, arm_rows in rows.items()}
    return probes, evals


def judge(base_probes: Mapping[str, Any], cand_probes: Mapping[str, Any], base_evals: list, cand_evals: list,
          targets: str, config: Config, change: dict) -> PilotResult:
    """The pilot's decision from both arms' probes (name -> ProbeResult) and validation evals."""
    target = target_probe(targets, cand_probes)
    what = describe_change(change)
    if not base_evals or not cand_evals:
        return PilotResult("reject", [f"pilot ({what}): an arm has no validation evals "
                                      "(domain.validation_size 0, or a train pool too small to carve one)"], target, None, None, "", None, change)
    verdict = verify_paired(base_evals, cand_evals, config.coevolve.verify_z)
    if target is None:
        return PilotResult("reject", [f"pilot ({what}): {NO_PROBE.format(targets=targets)}"],
                           None, None, None, verdict.describe(), None, change)
    b, c = base_probes[target].value, cand_probes[target].value
    if b is None or c is None:
        return PilotResult("reject", [f"pilot ({what}): {target} is undefined on an arm's rollouts"],
                           target, b, c, verdict.describe(), None, change)
    lower_better = cand_probes[target].direction == "above"
    improvement = (b - c) if lower_better else (c - b)
    margin = config.gate.margin
    fixed = improvement + 1e-12 >= margin
    reasons = [f"pilot ({what}, {config.coevolve.pilot_steps} steps per arm): {target} "
               f"{b:.4g} -> {c:.4g} ({'lower' if lower_better else 'higher'} is better, margin {margin:g})"
               + ("" if fixed else ": not fixed"),
               f"pilot: {verdict.describe()}"]
    ok = fixed and not verdict.regressed
    return PilotResult("promote" if ok else "reject", reasons if ok else [r for r, bad in
                       zip(reasons, (not fixed, verdict.regressed)) if bad] or reasons,
                       target, b, c, verdict.describe(), improvement / margin if margin else None, change)


__all__ = ["PilotResult", "arm_evidence", "decision_after_backtest", "dynamics_change", "judge", "needs_pilot", "pilot_run", "run_pilot",
           "target_probe"]
