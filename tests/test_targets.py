"""Targets from evidence, safety first under the proposal cap, the trusted dropped_live_rate probe,
and the standard probe table every seed builds on."""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import make_rollout

from evotrainer.api import Rollout
from evotrainer.api.probes import JUDGED_BY, STANDARD, standard
from evotrainer.backtest.gate import decide, targets_from_trailer
from evotrainer.backtest.metrics import LOWER_IS_BETTER, SAFETY_METRICS
from evotrainer.coevolve.choose import breadth_first
from evotrainer.config import GateConfig
from evotrainer.diagnose import HealthReport, ProbeResult, health_report
from evotrainer.diagnose.targets import SAFETY_PROBES, is_safety, judged_by, retarget, targets_text
from evotrainer.harness.loader import Harness, read_sources
from evotrainer.harness.repo import HarnessRepo
from evotrainer.paths import HARNESSES_DIR
from evotrainer.propose import Evidence
from evotrainer.propose.rules import RulesAgent
from evotrainer.skills import SkillLibrary
from evotrainer.store import Store, StoredRollout
from evotrainer.workspace import ensure_workspace

SEEDS = sorted(p.name for p in HARNESSES_DIR.iterdir() if (p / "diagnostics.py").is_file())


def roll(rid: str, group: str, kind: str, text: str = "Answer: 9") -> Rollout:
    ok = kind == "ok"
    return make_rollout(rid, task_id=f"task-{group}", group_id=group, prompt="What is 3 + 4?", completion=text,
                        success=ok, kind=kind, num_tokens=8)


# ---------------------------------------------------------------- the table


def test_every_probe_of_every_seed_names_the_metrics_that_judge_it() -> None:
    for seed in SEEDS:
        for p in Harness(read_sources(HARNESSES_DIR / seed), Path(seed)).probes:
            assert p.name in JUDGED_BY, f"{seed}: probe {p.name} has no row in api.probes.JUDGED_BY"
    for name in ("false_drop_rate", "dropped_live_rate", "mid_band_weight", "reward_hacking", "failure_reward_mean"):
        assert JUDGED_BY[name], f"trusted probe {name} must be judged by a backtest metric"
    for probe, metrics in JUDGED_BY.items():
        assert set(metrics) <= set(LOWER_IS_BETTER), f"{probe}: {metrics}"
        if probe in LOWER_IS_BETTER:  # a probe named like a metric is judged by that metric first
            assert metrics[0] == probe
    assert judged_by("proxy_auc_gap")[:2] == (("proxy_auc", "higher"), ("ordering_violations", "lower"))
    assert judged_by("entropy_fall") == () and judged_by("no_such_probe") == ()
    assert {"proxy_auc_gap", "false_drop_rate", "dropped_live_rate", "tampering_rate"} <= SAFETY_PROBES
    assert not {"dead_group_ratio", "truncation_rate", "mean_tokens", "entropy_fall"} & SAFETY_PROBES


def test_standard_table_is_what_each_seed_gets_with_its_own_changes() -> None:
    names = [p["name"] for p in STANDARD]
    for seed in SEEDS:
        got = [p.name for p in Harness(read_sources(HARNESSES_DIR / seed), Path(seed)).probes]
        assert got[: len(names)] == names, f"{seed} does not start from the whole standard table"
    built = standard(mean_tokens=(100.0, 120.0), drop=("judge_drift",))
    tokens = next(p for p in built if p["name"] == "mean_tokens")
    assert (tokens["warn"], tokens["critical"]) == (100.0, 120.0)
    assert next(p for p in STANDARD if p["name"] == "mean_tokens")["warn"] == 24.0  # the table is not mutated
    assert "judge_drift" not in [p["name"] for p in built] and len(built) == len(STANDARD) - 1
    with pytest.raises(ValueError, match="not standard probes: mean_tokenz"):
        standard(mean_tokenz=(1.0, 2.0))
    code = Harness(read_sources(HARNESSES_DIR / "code"), Path("code"))
    assert next(p for p in code.probes if p.name == "mean_tokens").critical == 120.0


# ---------------------------------------------------------------- targets from evidence


def test_evidence_targets_text_is_read_by_the_gate_and_the_pilot() -> None:
    from evotrainer.coevolve.pilot import target_probe

    text = targets_text(["proxy_auc_gap", "reward_success_gap"])
    assert text.startswith("proxy_auc_gap, reward_success_gap: proxy_auc, ordering_violations")
    assert targets_from_trailer(text)[:2] == ("proxy_auc", "ordering_violations")
    assert target_probe(text, {"proxy_auc_gap", "reward_success_gap"}) == "proxy_auc_gap"
    # a dynamics probe: no backtest metric, the live pilot judges the probe itself
    live = targets_text(["entropy_fall"])
    assert targets_from_trailer(live) == () and target_probe(live, {"entropy_fall"}) == "entropy_fall"
    assert target_probe(targets_text(["truncation_rate"]), {"truncation_rate", "mean_tokens"}) == "truncation_rate"
    assert targets_text(["my_own_probe"], "mean_tokens") == "mean_tokens"  # not in the table: the proposer's


def _report(*probes: tuple[str, float, str]) -> HealthReport:
    results = [ProbeResult(name, "result", value, level, 0.1, 0.5, "above") for name, value, level in probes]
    return HealthReport(results, 40, 10)


def test_an_agents_free_target_becomes_the_alerts_metrics() -> None:
    report = _report(("dead_group_ratio", 0.6, "critical"), ("proxy_auc_gap", 0.3, "warn"))
    # an llm agent names a metric: the alert it answers gives the rest
    assert retarget("ordering_violations", report) == targets_text(["proxy_auc_gap"])
    assert retarget("effective_data_ratio", report) == targets_text(["dead_group_ratio"])
    # or names the probe it repairs, with or without a report
    assert retarget("proxy_auc_gap") == targets_text(["proxy_auc_gap"])
    # evidence text stays as it is; a metric no alert is judged by stays the agent's own
    assert retarget(targets_text(["false_drop_rate"]), report) == targets_text(["false_drop_rate"])
    assert retarget("hacking_reward_mass", report) == "hacking_reward_mass"
    assert retarget("fewer empty answers", report) == "fewer empty answers"
    # a word that is both a metric and a probe is the metric: widened only by an alert
    assert retarget("dead_group_ratio") == "dead_group_ratio"
    assert retarget("dead_group_ratio", report) == targets_text(["dead_group_ratio"])


def test_gate_judges_the_best_of_several_declared_targets() -> None:
    base = {"dead_group_ratio": 0.0, "effective_data_ratio": 0.5, "ordering_violations": 0.0,
            "counterfactual_violations": 0.0, "proxy_auc": 0.6, "false_drop_rate": 0.0, "dropped_live_rate": 0.0,
            "hacking_reward_mass": 0.0, "mean_tokens": 8.0, "sampled_dead_group_ratio": None, "n_rollouts": 40}
    fixed = {**base, "proxy_auc": 1.0}
    only = decide(base, fixed, GateConfig(), declared_target="ordering_violations")
    assert only.decision == "reject" and "did not improve" in " ".join(only.reasons)
    both = decide(base, fixed, GateConfig(), declared_target=("ordering_violations", "proxy_auc"))
    assert both.decision == "promote" and both.target == "proxy_auc"
    assert "the best of the declared ordering_violations, proxy_auc" in " ".join(both.reasons)
    assert decide(base, base, GateConfig(), declared_target=("ordering_violations", "proxy_auc")).decision == "reject"
    assert decide(base, fixed, GateConfig(), declared_target=("proxy_auc", "nonsense")).decision == "reject"
    # dropped_live_rate met by leaving no live group (effective_data_ratio flat) is no repair
    dropping = {**fixed, "dropped_live_rate": 0.6}  # proxy_auc 1: no other safety fault to repair first
    killed = decide(dropping, fixed, GateConfig(), declared_target="dropped_live_rate")
    assert killed.decision == "reject" and "improved by losing what it measures" in " ".join(killed.reasons)
    kept = decide(dropping, {**fixed, "effective_data_ratio": 0.6}, GateConfig(), declared_target="dropped_live_rate")
    assert kept.decision == "promote" and kept.target == "dropped_live_rate"


def _ties_workspace(tmp_path: Path):
    """A math harness whose correctness weight was zeroed by mistake: every readable answer gets the
    same 0.1, so successes tie with wrong answers (proxy AUC 0.67) and no failure is ever paid
    strictly more (ordering_violations 0)."""
    seed = tmp_path / "seed"
    seed.mkdir()
    sources = read_sources(HARNESSES_DIR / "math")
    sources["harness.yaml"] = sources["harness.yaml"].replace("correct: 1.0", "correct: 0.0")
    assert "correct: 0.0" in sources["harness.yaml"]
    for name, text in sources.items():
        (seed / name).write_text(text)
    ws = ensure_workspace(tmp_path / "w", "math", seed=seed)
    rows = []
    for g in range(8):
        rows += [roll(f"g{g}-0", f"g{g}", "ok", "Answer: 7"), roll(f"g{g}-1", f"g{g}", "wrong"),
                 roll(f"g{g}-2", f"g{g}", "wrong"), roll(f"g{g}-3", f"g{g}", "format_error", "hmm")]
    with Store.open(ws.root) as store:
        store.add_rollouts(StoredRollout(rollout=r) for r in rows)
        repo = HarnessRepo(ws.harnesses)
        with repo.load() as harness:
            report = health_report(harness, list(store.iter_rollouts()))
    return ws, repo, report


def test_a_ties_fault_is_repaired_on_the_real_backtest_because_the_target_follows_the_evidence(tmp_path: Path) -> None:
    from evotrainer.backtest import backtest

    ws, repo, report = _ties_workspace(tmp_path)
    assert report.get("proxy_auc_gap").alert and report.get("dead_group_ratio").value == 0.0
    proposals = RulesAgent().propose(Evidence(1, "math", report, []), repo.sources(), SkillLibrary.load(ws.root))
    tier = next(p for p in proposals if p.skill == "verified-tier-reward")
    assert tier.targets.startswith("proxy_auc_gap: proxy_auc, ordering_violations")
    skill = SkillLibrary.load(ws.root).get("verified-tier-reward")
    assert skill.targets == "ordering_violations"
    # the same edit, once under the skill's own target (what the loop did before) and once under the evidence's
    as_skill = repo.propose(1, "tier-skill-target", tier.edits, diagnosis=tier.diagnosis, targets=skill.targets,
                            expected=tier.expected)
    as_evidence = repo.propose(1, "tier-evidence-target", tier.edits, diagnosis=tier.diagnosis,
                               targets=tier.targets, expected=tier.expected)
    before = backtest(ws.root, as_skill.branch, workers=1)
    base = before["metrics"]["base"]
    assert base["ordering_violations"] == 0.0 and base["proxy_auc"] == pytest.approx(2 / 3)
    assert before["decision"] == "reject" and before["target"] == "ordering_violations"
    assert any("did not improve" in r and "0 -> 0" in r for r in before["reasons"])
    after = backtest(ws.root, as_evidence.branch, workers=1)
    assert after["metrics"]["candidate"]["proxy_auc"] == 1.0
    assert after["decision"] == "promote" and after["target"] == "proxy_auc"
    assert after["declared_targets"][:2] == ["proxy_auc", "ordering_violations"]


# ---------------------------------------------------------------- safety first under the cap


def test_a_warn_level_ordering_alert_is_proposed_first_under_a_cap_of_one() -> None:
    sources = read_sources(HARNESSES_DIR / "math")
    report = _report(("dead_group_ratio", 0.7, "critical"), ("truncation_rate", 0.5, "critical"),
                     ("proxy_auc_gap", 0.05, "warn"))
    skills = SkillLibrary.load(None)
    first = RulesAgent(limit=1).propose(Evidence(1, "math", report, []), sources, skills)
    assert [p.skill for p in first] == ["verified-tier-reward"]
    everything = RulesAgent().propose(Evidence(1, "math", report, []), sources, skills)
    assert len(everything) > 3 and is_safety(everything[0].targets)
    # whatever order an agent hands them over in, the loop's cap (breadth_first, then [:cap]) keeps it
    for order in (everything, list(reversed(everything))):
        assert breadth_first(order)[0].skill == "verified-tier-reward"
    safe = [p for p in everything if is_safety(p.targets)]
    assert {p.slug for p in breadth_first(list(reversed(everything)))[: len(safe)]} == {p.slug for p in safe}


# ---------------------------------------------------------------- dropped live signal


# A filter meant to save compute on hopeless tasks: it drops every group without a verified
# success. false_drop_rate cannot see it (no success is dropped), yet the all-fail groups whose
# rewards spread (a readable wrong answer over an unreadable one) carried GRPO signal.
DROP_ALL_FAIL = '''from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    return True


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return any(r.outcome.success for r in rollouts)
'''


def _signal_rows() -> list[Rollout]:
    """2 groups with a success (live), 3 all-fail groups with a spread (live), 3 dead all-fail groups."""
    rows = []
    for g in range(2):
        rows += [roll(f"s{g}-0", f"s{g}", "ok", "Answer: 7"), *(roll(f"s{g}-{i}", f"s{g}", "wrong") for i in (1, 2, 3))]
    for g in range(3):
        rows += [roll(f"f{g}-0", f"f{g}", "wrong"), roll(f"f{g}-1", f"f{g}", "format_error", "hmm"),
                 roll(f"f{g}-2", f"f{g}", "wrong"), roll(f"f{g}-3", f"f{g}", "format_error", "hm")]
    for g in range(3):
        rows += [roll(f"d{g}-{i}", f"d{g}", "wrong") for i in range(4)]
    return rows


def test_dropped_live_rate_sees_live_groups_the_filters_drop_without_a_success() -> None:
    sources = read_sources(HARNESSES_DIR / "math")
    seed = health_report(Harness(sources, Path("seed")), _signal_rows())
    assert seed.get("dropped_live_rate").value == 0.0 and seed.get("dropped_live_rate").level == "ok"
    faulty = {**sources, "filters.py": DROP_ALL_FAIL,
              "diagnostics.py": sources["diagnostics.py"] + "\nPROBES.append(probe('dropped_live_rate', 'result', "
                                                            "lambda rs, ws: 0.0, 0.05, 0.2, 'above'))\n"}
    report = health_report(Harness(faulty, Path("x")), _signal_rows())
    assert report.get("false_drop_rate").value == 0.0  # blind to it
    live = [p for p in report.probes if p.name == "dropped_live_rate"]
    assert len(live) == 1, "the trusted value replaces a harness probe of the same name"
    assert live[0].value == pytest.approx(3 / 5) and live[0].level == "critical"
    assert live[0].examples and all(e.startswith("f") for e in live[0].examples)
    # dropping rollouts is not dropping the signal while a kept one still has an advantage
    keep_successes = DROP_ALL_FAIL.replace("    return True", "    return rollout.outcome.success").replace(
        "return any(r.outcome.success for r in rollouts)", "return True")
    partial = health_report(Harness({**sources, "filters.py": keep_successes}, Path("y")), _signal_rows())
    assert partial.get("dropped_live_rate").value == pytest.approx(3 / 5)  # the all-fail groups keep nothing
    assert partial.get("false_drop_rate").value == 0.0
    # no live group: not measurable
    dead = [r for r in _signal_rows() if r.group_id.startswith("d")]
    assert health_report(Harness(sources, Path("z")), dead).get("dropped_live_rate").level == "n/a"


def test_dropped_live_rate_is_a_backtest_metric_a_repair_is_judged_by(tmp_path: Path) -> None:
    from evotrainer.backtest import backtest

    seed = tmp_path / "seed"
    seed.mkdir()
    sources = {**read_sources(HARNESSES_DIR / "math"), "filters.py": DROP_ALL_FAIL}
    for name, text in sources.items():
        (seed / name).write_text(text)
    ws = ensure_workspace(tmp_path / "w", "math", seed=seed)
    with Store.open(ws.root) as store:
        store.add_rollouts(StoredRollout(rollout=r) for r in _signal_rows())
        repo = HarnessRepo(ws.harnesses)
        with repo.load() as harness:
            report = health_report(harness, list(store.iter_rollouts()))
    assert report.get("dropped_live_rate").alert
    seed_filters = read_sources(HARNESSES_DIR / "math")["filters.py"]
    cand = repo.propose(1, "keep-all-fail-groups", {"filters.py": seed_filters}, diagnosis="drops live groups",
                        targets=targets_text(["dropped_live_rate"]), expected="dropped_live_rate to 0")
    result = backtest(ws.root, cand.branch, workers=1)
    base, new = result["metrics"]["base"], result["metrics"]["candidate"]
    assert base["dropped_live_rate"] == pytest.approx(3 / 5) and new["dropped_live_rate"] == 0.0
    assert base["false_drop_rate"] == 0.0 == new["false_drop_rate"]
    assert result["decision"] == "promote" and result["target"] == "dropped_live_rate"
    assert LOWER_IS_BETTER["dropped_live_rate"] and "dropped_live_rate" not in SAFETY_METRICS


def test_every_replayable_shipped_case_is_judged_on_a_metric_its_repair_criteria_name() -> None:
    """A case's detect probes, through the table, gate every proposal made for it: a replayable case
    whose repair criteria none of them names could not be repaired by following the evidence."""
    from evotrainer.faultbench import load_cases
    from evotrainer.paths import FAULT_CASES_DIR

    for case in load_cases(FAULT_CASES_DIR):
        judged = {m for p in case.spec.detect for m in JUDGED_BY.get(p, ())}
        wanted = {c.metric for c in case.spec.repair}
        assert case.spec.live or judged & wanted, f"{case.name}: detect {case.spec.detect} judged by {judged}"
