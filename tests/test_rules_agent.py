"""The `rules` outer agent: triggered skills become loadable, committable proposals, in a sane order."""

from __future__ import annotations

import re
from pathlib import Path

from factories import make_rollout

from evotrainer.api import Rollout
from evotrainer.diagnose import HealthReport, ProbeResult, health_report
from evotrainer.harness.loader import Harness, read_sources
from evotrainer.harness.repo import HarnessRepo
from evotrainer.paths import HARNESSES_DIR
from evotrainer.propose import Evidence, Proposal, get_agent
from evotrainer.propose.rules import RulesAgent, proposal_slug
from evotrainer.skills import SkillLibrary, save_learned
from evotrainer.workspace import ensure_workspace

# The seed with its `format` weight at 0: a correctness-only base, the plainest harness a skill
# can be applied to (the shipped seed already pays a clean finish, which partial credit extends).
MATH = read_sources(HARNESSES_DIR / "math")
MATH["harness.yaml"] = MATH["harness.yaml"].replace("format: 0.1", "format: 0.0")
assert "format: 0.0" in MATH["harness.yaml"]


def roll(rid: str, group: str, kind: str = "wrong", text: str = "I think 7", truncated: bool = False) -> Rollout:
    return make_rollout(rid, task_id="t", group_id=group, prompt="q", completion=text, success=kind == "ok", kind=kind,
                        num_tokens=8, truncated=truncated)


def dead_report() -> HealthReport:
    """60% dead groups (critical), nothing else alarming."""
    rows = [roll(f"d{g}{i}", f"dead{g}") for g in range(6) for i in range(4)]
    rows += [r for g in range(4) for r in (roll(f"l{g}0", f"live{g}", "ok", "Answer: 7"),
                                           *(roll(f"l{g}{i}", f"live{g}", text="Answer: 9") for i in (1, 2, 3)))]
    report = health_report(Harness(MATH, Path("seed")), rows)
    assert report.get("dead_group_ratio").level == "critical"
    return report


def evidence(report, domain: str = "math") -> Evidence:
    return Evidence(round_index=1, domain=domain, report=report, samples=[])


def test_critical_dead_groups_propose_partial_credit_and_group_filter() -> None:
    agent = get_agent("rules")
    assert agent.name == "rules"
    proposals = agent.propose(evidence(dead_report()), MATH, SkillLibrary.load(None))
    skills = {p.skill for p in proposals}
    assert {"partial-credit-format", "zero-variance-group-filter"} <= skills
    assert "judge-step-attribution" not in skills  # off by default
    assert not skills & {"search-before-edit", "edit-then-test", "abandonment-filter"}  # swe only
    assert "mask-truncated" not in skills  # truncation_rate is 0: its trigger does not fire
    slugs = [p.slug for p in proposals]
    assert len(set(slugs)) == len(slugs)
    for p in proposals:
        assert isinstance(p, Proposal) and re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", p.slug) and len(p.slug) <= 48
        assert p.edits and all(MATH.get(f) != t for f, t in p.edits.items())
        Harness({**MATH, **p.edits}, Path("x"))
        assert p.targets and p.expected and "dead_group_ratio = 0.6 (critical" in p.diagnosis
    pcf = [p for p in proposals if p.skill == "partial-credit-format"]
    assert [p.params for p in pcf] == [{"weight": 0.1}, {"weight": 0.05}]
    # Targets come from the evidence (the fired probe's metrics), not from the skill
    assert pcf[1].slug == "partial-credit-format-weight-0p05"
    assert pcf[0].targets == "dead_group_ratio: dead_group_ratio, effective_data_ratio, sampled_dead_group_ratio"
    zvf = next(p for p in proposals if p.skill == "zero-variance-group-filter")
    assert zvf.targets == pcf[0].targets  # its skill names mean_tokens; the alert was dead groups
    assert "dead_group_ratio should decrease (margin 0.02)" in pcf[0].expected
    # The library, its name -> skill dict and a plain list are all accepted.
    lib = SkillLibrary.load(None)
    for form in (lib.skills, list(lib)):
        assert [p.slug for p in agent.propose(evidence(dead_report()), MATH, form)] == slugs


def test_failed_skills_are_never_proposed_and_validated_come_first(tmp_path: Path) -> None:
    lib = SkillLibrary.load(None)
    save_learned(tmp_path, lib.get("partial-credit-format"), "failed", {"round": 2, "domain": "math"})
    save_learned(tmp_path, lib.get("zero-variance-group-filter"), "validated", {"round": 1, "domain": "math"})
    proposals = RulesAgent().propose(evidence(dead_report()), MATH, SkillLibrary.load(tmp_path))
    skills = [p.skill for p in proposals]
    assert "partial-credit-format" not in skills
    # All fired on the same critical probe: the validated skill's grid comes before any seed skill.
    assert skills[:3] == ["zero-variance-group-filter"] * 3 and "pass-rate-curriculum" in skills[3:]


def test_off_by_default_skill_only_when_enabled() -> None:
    lib = SkillLibrary.load(None)
    assert "judge-step-attribution" not in {p.skill for p in RulesAgent().propose(evidence(dead_report()), MATH, lib)}
    enabled = get_agent("rules", enable=["judge-step-attribution"])
    judged = [p for p in enabled.propose(evidence(dead_report()), MATH, lib) if p.skill == "judge-step-attribution"]
    assert [p.params for p in judged] == [{"alpha": 0.1}, {"alpha": 0.05}]
    assert len(get_agent("rules", limit=2).propose(evidence(dead_report()), MATH, lib)) == 2


def test_severity_orders_proposals_and_no_op_points_are_skipped() -> None:
    probe = ProbeResult
    report = HealthReport([
        probe("dead_group_ratio", "result", 0.35, "warn", 0.3, 0.5, "above"),
        probe("truncation_rate", "efficiency", 0.4, "critical", 0.1, 0.3, "above"),
    ], n_rollouts=80, n_groups=10)
    lib = SkillLibrary.load(None)
    agent = RulesAgent()
    proposals = agent.propose(evidence(report), MATH, lib)
    first_warn = next(i for i, p in enumerate(proposals) if "(warn;" in p.diagnosis)
    assert all("(critical;" in p.diagnosis for p in proposals[:first_warn])
    # Truncation fires three skills: two replayable ones and longer-completions (a piloted
    # change to the sampling length).
    assert {p.skill for p in proposals[:first_warn]} == {"mask-truncated", "overlong-penalty",
                                                         "longer-completions"}
    # Once a grid point is in the harness, proposing it again changes nothing and is skipped;
    # the skill's other grid points remain as retunings.
    applied = next(p for p in proposals if p.skill == "mask-truncated")
    again = agent.propose(evidence(report), {**MATH, **applied.edits}, lib)
    assert applied.slug not in {p.slug for p in again}
    assert (applied.slug, "changes nothing in the current harness") in agent.skipped
    assert any(p.skill == "mask-truncated" for p in again)
    # A report given as JSON works the same.
    assert [p.slug for p in agent.propose(evidence(report.to_json()), MATH, lib)] == [p.slug for p in proposals]
    # Nothing fires on a healthy report.
    healthy = HealthReport([probe("dead_group_ratio", "result", 0.0, "ok", 0.3, 0.5, "above")], 8, 1)
    assert agent.propose(evidence(healthy), MATH, lib) == []


def test_proposals_commit_to_the_harness_repo(tmp_path: Path) -> None:
    ws = ensure_workspace(tmp_path / "w", "math")
    repo = HarnessRepo(ws.harnesses)
    proposals = RulesAgent().propose(evidence(dead_report()), repo.sources(), SkillLibrary.load(ws.root))
    for p in proposals[:3]:
        cand = repo.propose(1, p.slug, p.edits, diagnosis=p.diagnosis, targets=p.targets, expected=p.expected)
        harness = repo.load(cand.branch)
        assert harness.version == cand.sha
        assert repo.log(rev=cand.branch, limit=1)[0].trailers["Targets"] == p.targets


def test_slugs_are_compact_and_bounded() -> None:
    lib = SkillLibrary.load(None)
    assert proposal_slug(lib.get("pass-rate-curriculum"), {"band": [0.1, 0.9], "floor": 0.2}) == \
        "pass-rate-curriculum-band-0p1-0p9"
    assert proposal_slug(lib.get("mask-truncated"), {"mode": "all"}) == "mask-truncated-mode-all"
    long = proposal_slug(lib.get("zero-variance-group-filter"), {"min_std": 0.123456789012345})
    assert len(long) <= 48 and re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", long)


def test_partial_credit_backtest_rescues_dead_groups_without_ordering_violations(tmp_path: Path) -> None:
    """End to end through the real sandboxed backtest engine: diagnose -> propose -> commit -> replay."""
    from evotrainer.backtest import backtest
    from evotrainer.store import Store, StoredRollout

    plain = tmp_path / "plain"  # a correctness-only base: the seed's format weight at 0
    plain.mkdir()
    for name, text in MATH.items():
        (plain / name).write_text(text)
    ws = ensure_workspace(tmp_path / "w", "math", seed=plain)
    rows = []
    for g in range(6):  # dead under the seed: no answer marker, all wrong; half end in a number
        rows += [roll(f"d{g}{i}", f"dead{g}", *(("wrong", "so the result is 7") if i % 2 else ("format_error", "hmm")))
                 for i in range(4)]
    for g in range(4):
        rows += [roll(f"l{g}0", f"live{g}", "ok", "Answer: 7")]
        rows += [roll(f"l{g}{i}", f"live{g}", "wrong", "9") for i in (1, 2, 3)]
    with Store.open(ws.root) as store:
        store.add_rollouts(StoredRollout(rollout=r) for r in rows)
        repo = HarnessRepo(ws.harnesses)
        report = health_report(repo.load(), store.iter_rollouts())
    proposal = next(p for p in RulesAgent().propose(evidence(report), repo.sources(), SkillLibrary.load(ws.root))
                    if p.skill == "partial-credit-format")
    cand = repo.propose(1, proposal.slug, proposal.edits, diagnosis=proposal.diagnosis,
                        targets=proposal.targets, expected=proposal.expected)
    result = backtest(ws.root, cand.branch, workers=1)
    base, new = result["metrics"]["base"], result["metrics"]["candidate"]
    assert base["dead_group_ratio"] == 0.6 and new["dead_group_ratio"] == 0.0
    assert new["ordering_violations"] == 0.0 and new["proxy_auc"] == base["proxy_auc"] == 1.0
    assert result["decision"] == "promote" and result["target"] == "dead_group_ratio"
