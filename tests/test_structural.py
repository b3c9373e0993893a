"""The structural agent: ablations of the harness's own parts for alerts no skill answers, gated on
the real backtest like any proposal."""

from __future__ import annotations

import ast
from pathlib import Path

from evotrainer.diagnose import HealthReport, ProbeResult, health_report
from evotrainer.diagnose.targets import targets_text
from evotrainer.harness.loader import read_sources
from evotrainer.harness.repo import HarnessRepo
from evotrainer.paths import HARNESSES_DIR
from evotrainer.propose import Evidence, get_agent
from evotrainer.propose.structural import StructuralAgent, filter_ablations
from evotrainer.skills import SkillLibrary
from evotrainer.store import Store, StoredRollout
from evotrainer.workspace import ensure_workspace
from tests.test_targets import DROP_ALL_FAIL, _signal_rows

FILTERS = '''def keep_rollout(rollout) -> bool:
    if rollout.num_tokens > 30:
        return False
    return rollout.outcome.kind != "empty" and not rollout.truncated


def keep_group(rollouts, rewards) -> bool:
    return True
'''


def test_each_filter_condition_is_removed_alone() -> None:
    got = {slug: (part, text) for slug, part, text in filter_ablations(FILTERS)}
    assert set(got) == {"keep_rollout-guard-0", "keep_rollout-cond-0", "keep_rollout-cond-1", "keep_rollout-all"}
    for _, text in got.values():
        ast.parse(text)
        assert text != FILTERS and "def keep_group(rollouts, rewards) -> bool:\n    return True" in text
    assert "num_tokens" not in got["keep_rollout-guard-0"][1] and "not rollout.truncated" in got["keep_rollout-guard-0"][1]
    assert 'return not rollout.truncated' in got["keep_rollout-cond-0"][1] and "num_tokens > 30" in got["keep_rollout-cond-0"][1]
    assert 'return rollout.outcome.kind != "empty"\n' in got["keep_rollout-cond-1"][1]
    assert "    return True\n\n\ndef keep_group" in got["keep_rollout-all"][1]
    assert "`rollout.outcome.kind != \"empty\"`" in got["keep_rollout-cond-0"][0]
    assert list(filter_ablations("def keep_rollout(r):\n    return True\n")) == []
    assert list(filter_ablations("def keep_rollout(r:\n")) == []  # does not parse: nothing to ablate


def test_nothing_structural_while_every_alert_has_a_skill() -> None:
    report = HealthReport([ProbeResult("dead_group_ratio", "result", 0.7, "critical", 0.3, 0.5, "above")], 40, 10)
    agent = get_agent("structural")
    sources = read_sources(HARNESSES_DIR / "math")
    proposals = agent.propose(Evidence(1, "math", report, []), sources, SkillLibrary.load(None))
    assert proposals and all(p.skill for p in proposals) and agent.uncovered == []


def test_an_alert_no_skill_answers_is_repaired_by_an_ablation_on_the_real_backtest(tmp_path: Path) -> None:
    """A filter that drops every group without a success: dropped_live_rate alerts and no skill's
    trigger reads it. The ablation that keeps every group passes the gate; zeroing the format
    weight also zeroes dropped_live_rate (no group is live any more) and must not."""
    from evotrainer.backtest import backtest
    from evotrainer.coevolve.choose import passing_best_first

    seed = tmp_path / "seed"
    seed.mkdir()
    math_seed = read_sources(HARNESSES_DIR / "math")
    for name, text in {**math_seed, "filters.py": DROP_ALL_FAIL}.items():
        (seed / name).write_text(text)
    ws = ensure_workspace(tmp_path / "w", "math", seed=seed)
    with Store.open(ws.root) as store:
        store.add_rollouts(StoredRollout(rollout=r) for r in _signal_rows())
        repo = HarnessRepo(ws.harnesses)
        with repo.load() as harness:
            report = health_report(harness, list(store.iter_rollouts()))
    assert report.get("dropped_live_rate").level == "critical"
    agent = StructuralAgent()
    proposals = agent.propose(Evidence(1, "math", report, []), repo.sources(), SkillLibrary.load(ws.root))
    assert "dropped_live_rate" in agent.uncovered
    ablations = [p for p in proposals if p.skill is None]
    slugs = {p.slug for p in ablations}
    assert {"ablate-weight-correct", "ablate-weight-format", "ablate-keep-group-all", "restore-filters"} <= slugs
    for p in ablations:
        assert len(p.edits) == 1 and p.targets == targets_text(agent.uncovered)
        assert "no skill's trigger answers it" in p.diagnosis and "Structural ablation" in p.diagnosis
    assert "`any(r.outcome.success for r in rollouts)`" in next(
        p.diagnosis for p in ablations if p.slug == "ablate-keep-group-all")

    class Tried:
        def __init__(self, slug, report):
            self.slug, self.targets, self.decision = slug, report["declared_target"], report["decision"]
            self.report = report
            self.gain = None

    tried = {}
    for p in ablations:
        cand = repo.propose(1, p.slug, dict(p.edits), diagnosis=p.diagnosis, targets=p.targets, expected=p.expected)
        tried[p.slug] = backtest(ws.root, cand.branch, workers=1)
    keep = tried["ablate-keep-group-all"]
    assert keep["decision"] == "promote" and keep["target"] == "dropped_live_rate"
    assert keep["metrics"]["candidate"]["dropped_live_rate"] == 0.0
    fmt = tried["ablate-weight-format"]
    assert fmt["metrics"]["candidate"]["dropped_live_rate"] == 0.0  # no live group left to drop...
    assert fmt["decision"] == "reject"  # ...because the signal is gone: the gate sees it
    assert any("improved by losing what it measures" in r for r in fmt["reasons"])
    assert tried["ablate-weight-correct"]["decision"] == "reject"  # ordering and AUC collapse
    assert {s for s, r in tried.items() if r["decision"] == "promote"} <= {"ablate-keep-group-all", "restore-filters"}
    passing = passing_best_first([Tried(s, r) for s, r in tried.items()])
    assert passing and passing[0].slug in ("ablate-keep-group-all", "restore-filters")
