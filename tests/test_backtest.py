"""The backtest engine and gate, on real git harness repos and real SQLite stores.

Rollouts are hand-made groups with known verified outcomes, so every number below can be
worked out on paper; no model is involved.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from factories import make_rollout, make_stored
from typer.testing import CliRunner

from evotrainer.backtest import Selector, backtest, group_advantages, replay, run_backtest
from evotrainer.backtest.engine import HarnessVersion
from evotrainer.backtest.gate import target_from_trailer
from evotrainer.config import GateConfig, load_config
from evotrainer.harness.loader import read_sources
from evotrainer.harness.repo import HarnessRepo
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.store import Store, StoredRollout
from evotrainer.workspace import ensure_workspace

COMPLETIONS = {"ok": "Answer: 4", "wrong": "Answer: 5", "format_error": "I do not know",
               "empty": "", "tampering": "print('PASS')"}


def rollout(gid: str, k: int, kind: str, tokens: int, marker: bool | None = None, *,
            flags: tuple[str, ...] = (), completion: str | None = None, **train) -> StoredRollout:
    marker = kind in ("ok", "wrong") if marker is None else marker
    success = kind == "ok"
    return make_stored(make_rollout(
        f"{gid}-{k}", task_id=f"task-{gid}", group_id=gid,
        completion=COMPLETIONS[kind] if completion is None else completion,
        success=success, kind=kind, flags=(("answer_marker",) if marker else ()) + flags,
        num_tokens=tokens, meta={"level": 1, "tags": ["synthetic"]}), **train)


def gate_groups(**train) -> list[StoredRollout]:
    """16 groups of 8. Under BASE_REWARD (correct + 0.1 * answer marker) 10 are dead: the six
    all-failure groups mixing unmarked wrong answers and format errors, two hopeless, two solved."""
    rows = []
    for g in range(6):  # mixed: short marked successes, long failures
        kinds = [("ok", 6, True)] * 3 + [("wrong", 28, True)] * 3 + [("format_error", 30, False)] * 2
        rows += [rollout(f"mixed{g}", k, *spec, **train) for k, spec in enumerate(kinds)]
    for g in range(6):  # rescuable: every answer wrong, half of them at least a number
        kinds = [("wrong", 10 + k, False) for k in range(4)] + [("format_error", 14 + k, False) for k in range(4)]
        rows += [rollout(f"rescue{g}", k, *spec, **train) for k, spec in enumerate(kinds)]
    for g in range(2):
        rows += [rollout(f"hopeless{g}", k, "format_error", 20, **train) for k in range(8)]
        rows += [rollout(f"solved{g}", k, "ok", 8, **train) for k in range(8)]
    return rows


SEED_REWARD_HEAD = '''"""Reward components for math: correctness plus a small bonus for the answer marker."""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {
        "correct": 1.0 if rollout.outcome.success else 0.0,
        "format": 1.0 if "answer_marker" in rollout.outcome.flags else 0.0,
'''
# The base these tests reason about; pinned here, so the shipped seed can change without them.
BASE_REWARD = SEED_REWARD_HEAD + "    }\n"
LENGTH_BONUS = SEED_REWARD_HEAD + '''        "length": 0.05 * rollout.num_tokens,
    }
'''
PARTIAL_CREDIT = SEED_REWARD_HEAD + '''        "partial": 0.3 if rollout.outcome.kind == "wrong" else 0.0,
    }
'''


def base_sources() -> dict[str, str]:
    return {**read_sources(HARNESSES_DIR / "math"), "reward.py": BASE_REWARD}


def workspace(root: Path):
    """A real workspace whose main is the package's math seed with BASE_REWARD."""
    seed = root.parent / f"{root.name}-seed"
    seed.mkdir(parents=True)
    for name, text in base_sources().items():
        (seed / name).write_text(text)
    return ensure_workspace(root, "math", seed=seed)


@pytest.fixture
def ws(tmp_path: Path):
    """A real workspace (git harness repo) with a run of two rounds of gate_groups()."""
    ws = workspace(tmp_path / "work")
    with Store.open(ws.root) as store:
        run = store.get_or_create_run("default", "math", {})
        rounds = [store.start_round(run, i, "seed", "base") for i in range(2)]
        rows = gate_groups(run_id=run, round_id=rounds[0])
        # round 1 repeats the groups under other ids: selectors must tell the rounds apart
        rows += [StoredRollout(rollout=replace(r.rollout, id="r1-" + r.rollout.id,
                                               group_id="r1-" + r.rollout.group_id),
                               run_id=run, round_id=rounds[1]) for r in gate_groups()]
        store.add_rollouts(rows)
    return ws


def propose(ws, slug: str, reward_py: str, targets: str = "dead_group_ratio", **edits: str) -> str:
    repo = HarnessRepo(ws.harnesses)
    return repo.propose(1, slug, {"reward.py": reward_py, **edits}, diagnosis="10 of 16 groups are dead",
                        targets=targets, expected="fewer dead groups").branch


def run(ws, branch: str, **kwargs):
    with Store.open(ws.root) as store:
        return backtest(ws.root, branch, store=store, selector=Selector(run="default", round=0), **kwargs)


HASH_NOISE = SEED_REWARD_HEAD.replace("from evotrainer.api import Rollout", "import hashlib\n\nfrom evotrainer.api import Rollout") + \
    '        "spread": 1.5 * hashlib.sha256(rollout.completion.encode()).digest()[0] / 255.0,\n    }\n'


def test_a_bonus_that_outranks_success_is_caught_in_groups_without_one(tmp_path: Path):
    """Seen in the harness-fault benchmark (swe-sparse-dead-groups): over rollouts with no
    success at all, a hash-noise bonus revives every dead group and breaks no real success-failure
    order, so ordering_violations cannot see that it pays a failure more than a success. Each
    failure rescored as a success can: the gate rejects the bonus and passes partial credit."""
    ws = workspace(tmp_path / "work")
    rows = []
    for g in range(6):  # every answer wrong, half of them at least a number: no success anywhere
        kinds = [("wrong", 10 + k, False) for k in range(4)] + [("format_error", 14 + k, False) for k in range(4)]
        rows += [rollout(f"rescue{g}", k, *spec, completion=f"Answer: {g}{k}") for k, spec in enumerate(kinds)]
    with Store.open(ws.root) as store:
        store.add_rollouts(rows)
        noise = backtest(ws.root, propose(ws, "hash-noise", HASH_NOISE), store=store)
        partial = backtest(ws.root, propose(ws, "partial-credit", PARTIAL_CREDIT), store=store)
    base, cand = noise["metrics"]["base"], noise["metrics"]["candidate"]
    assert base["dead_group_ratio"] == 1.0 and cand["dead_group_ratio"] == 0.0
    assert cand["ordering_violations"] == base["ordering_violations"] == 0.0  # no success, no pair
    assert base["counterfactual_violations"] == 0.0
    assert cand["counterfactual_violations"] > 0.05
    assert noise["decision"] == "reject"
    assert any("counterfactual_violations worsened" in r for r in noise["reasons"])
    assert partial["metrics"]["candidate"]["counterfactual_violations"] == 0.0  # 1.0 as a success beats 0.3
    assert partial["decision"] == "promote", partial["reasons"]


def test_gate_rejects_length_bonus_that_ranks_failures_above_successes(ws):
    branch = propose(ws, "length-bonus", LENGTH_BONUS)
    report = run(ws, branch)
    base, cand = report["metrics"]["base"], report["metrics"]["candidate"]
    assert report["n_rollouts"] == 128 and base["n_groups"] == 16
    assert base["dead_group_ratio"] == 10 / 16
    assert cand["dead_group_ratio"] == 4 / 16  # it does rescue dead groups...
    assert base["ordering_violations"] == 0
    # ...but in each mixed group every failure outranks every success: 15 of 15 pairs
    assert cand["ordering_violations"] == 1.0
    assert cand["proxy_auc"] < base["proxy_auc"]
    assert report["decision"] == "reject"
    assert report["target"] == "dead_group_ratio"
    assert any("ordering_violations worsened" in r for r in report["reasons"])
    assert not any("dead_group_ratio" in r for r in report["reasons"])  # the target itself passed
    # report files, the index row, and the trailer on the candidate commit
    assert (ws.backtests / f"{report['id']}.json").is_file()
    md = (ws.backtests / f"{report['id']}.md").read_text()
    assert "| ordering_violations ↓ | 0.0000 | 1.0000 | +1.0000 ✗ |" in md
    with Store.open(ws.root) as store:
        assert store.get_backtest(report["id"])["decision"] == "reject"
        assert [b["id"] for b in store.backtests()] == [report["id"]]
    repo = HarnessRepo(ws.harnesses)
    assert repo.log(rev=branch, limit=1)[0].trailers["Backtest"] == report["id"]
    assert repo.resolve(f"refs/backtests/{report['id']}") == report["candidate"]


def test_gate_promotes_partial_credit_that_rescues_dead_groups_in_order(ws):
    report = run(ws, propose(ws, "partial-credit", PARTIAL_CREDIT))
    base, cand = report["metrics"]["base"], report["metrics"]["candidate"]
    assert cand["dead_group_ratio"] == 4 / 16
    assert cand["effective_data_ratio"] > base["effective_data_ratio"]
    assert cand["ordering_violations"] == 0 and cand["proxy_auc"] == base["proxy_auc"] == 1.0
    assert report["decision"] == "promote", report["reasons"]
    assert report["reasons"][0].startswith("both harnesses scored all 128 rollouts")
    assert report["deltas"]["dead_group_ratio"] == -0.375


def test_gate_without_targets_trailer_takes_the_best_default_target():
    assert target_from_trailer("proxy_auc (expect +0.05)") == "proxy_auc"
    assert target_from_trailer("fewer empty answers") is None
    from evotrainer.backtest import decide

    base = {"dead_group_ratio": 0.5, "effective_data_ratio": 0.5, "proxy_auc": 0.99, "n_rollouts": 8,
            "ordering_violations": 0.0, "false_drop_rate": 0.0, "hacking_reward_mass": 0.0}
    better = {**base, "effective_data_ratio": 0.52}
    d = decide(base, better, GateConfig())
    assert d.decision == "promote" and d.target == "effective_data_ratio"
    d = decide(base, {**base, "effective_data_ratio": 0.519}, GateConfig())
    assert d.decision == "reject" and "none of" in d.reasons[0]
    # a safety metric may move within tolerance, not beyond it
    assert decide(base, {**better, "proxy_auc": 0.986}, GateConfig()).decision == "promote"
    assert decide(base, {**better, "proxy_auc": 0.984}, GateConfig()).decision == "reject"
    assert decide(base, better, GateConfig(margin=0.05)).decision == "reject"


def test_gate_judges_mean_tokens_relative_to_the_base():
    from evotrainer.backtest import decide

    base = {"dead_group_ratio": 0.5, "effective_data_ratio": 0.5, "proxy_auc": 0.99, "n_rollouts": 8,
            "ordering_violations": 0.0, "false_drop_rate": 0.0, "hacking_reward_mass": 0.0,
            "mean_tokens": 30.0}
    # 0.5 tokens fewer clears an absolute 0.02 margin, but is under 2% of the base: not a real cut
    d = decide(base, {**base, "mean_tokens": 29.5}, GateConfig(), declared_target="mean_tokens")
    assert d.decision == "reject" and "margin 0.05 of the base" in d.reasons[0]
    d = decide(base, {**base, "mean_tokens": 27.0}, GateConfig(), declared_target="mean_tokens")
    assert d.decision == "promote" and d.target == "mean_tokens"
    assert decide(base, {**base, "mean_tokens": 27.0}, GateConfig(token_margin=0.2),
                  declared_target="mean_tokens").decision == "reject"


def test_a_change_that_leaves_no_training_signal_is_never_a_gain():
    """Seen on swe: a filter that kept nothing 'improved' mean_tokens 120.9 -> 0 and was promoted."""
    from evotrainer.backtest import decide

    base = {"dead_group_ratio": 1.0, "effective_data_ratio": 0.0, "proxy_auc": None, "n_rollouts": 16,
            "ordering_violations": 0.0, "false_drop_rate": 0.0, "hacking_reward_mass": 0.0, "mean_tokens": 120.9}
    keeps_nothing = {**base, "mean_tokens": 0.0}
    d = decide(base, keeps_nothing, GateConfig(), declared_target="mean_tokens")
    assert d.decision == "reject" and any("nothing to train on" in r for r in d.reasons)
    live = {**base, "dead_group_ratio": 0.5, "effective_data_ratio": 0.25, "mean_tokens": 100.0}
    assert decide({**live, "mean_tokens": 120.9}, live, GateConfig(), declared_target="mean_tokens").decision == "promote"


def test_a_harness_with_a_safety_fault_is_repaired_before_anything_else_passes():
    """Seen on math-group-filter-drops-live: the filters dropped every verified success, and a
    change that also dropped long rollouts passed on mean_tokens, false_drop_rate being at 1 already."""
    from evotrainer.backtest import decide

    base = {"dead_group_ratio": 0.2, "effective_data_ratio": 0.3, "proxy_auc": 1.0, "n_rollouts": 16,
            "ordering_violations": 0.0, "false_drop_rate": 1.0, "hacking_reward_mass": 0.0, "mean_tokens": 12.8}
    cheaper = {**base, "mean_tokens": 8.5}
    d = decide(base, cheaper, GateConfig(), declared_target="mean_tokens")
    assert d.decision == "reject" and any("unrepaired: false_drop_rate 1" in r for r in d.reasons)
    repair = {**base, "false_drop_rate": 0.0}
    assert decide(base, repair, GateConfig(), declared_target="false_drop_rate").decision == "promote"
    # Once repaired, an efficiency change passes again; inverted tiers hold changes back the same way.
    assert decide(repair, {**repair, "mean_tokens": 8.5}, GateConfig(), declared_target="mean_tokens").decision == "promote"
    inverted = {**repair, "ordering_violations": 0.2}
    assert decide(inverted, {**inverted, "mean_tokens": 8.5}, GateConfig(),
                  declared_target="mean_tokens").decision == "reject"


def test_passing_candidates_are_ranked_in_margins_not_raw_units():
    from evotrainer.backtest.gate import margins_gained
    from evotrainer.coevolve.choose import gain as _gain

    gate = GateConfig()  # margin 0.02 on ratios, token_margin 0.05 of the base on mean_tokens
    tokens = {"target": "mean_tokens", "metrics": {"base": {"mean_tokens": 100.0}, "candidate": {"mean_tokens": 94.0}}}
    dead = {"target": "dead_group_ratio",
            "metrics": {"base": {"dead_group_ratio": 0.6}, "candidate": {"dead_group_ratio": 0.4}}}
    # Raw deltas would rank 6 tokens over 0.2 of the groups revived; in margins it is 1.2 against 10.
    assert _gain(tokens, gate) == margins_gained("mean_tokens", 100.0, 94.0, gate) == pytest.approx(1.2)
    assert _gain(dead, gate) > _gain(tokens, gate)
    assert _gain({"target": None, "metrics": {}}, gate) is None


def test_a_passing_safety_repair_is_promoted_before_a_bigger_efficiency_gain():
    from types import SimpleNamespace

    from evotrainer.coevolve.choose import passing_best_first

    tokens = SimpleNamespace(decision="promote", targets="mean_tokens", gain=6.7)
    tiers = SimpleNamespace(decision="promote", targets="ordering_violations", gain=3.5)
    dead = SimpleNamespace(decision="promote", targets="dead_group_ratio", gain=9.0)
    failed = SimpleNamespace(decision="reject", targets="false_drop_rate", gain=50.0)
    assert passing_best_first([tokens, dead, tiers, failed]) == [tiers, dead, tokens]


def test_replay_reproduces_every_metric_and_the_decision(ws):
    from evotrainer.cli.main import app

    report = run(ws, propose(ws, "length-bonus", LENGTH_BONUS))
    with Store.open(ws.root) as store:  # rollouts stored later must not leak into the replay
        run_id = store.run_id("default")
        round0 = store.rounds(run_id)[0]["id"]
        store.add_rollouts([StoredRollout(rollout=replace(r.rollout, id="late-" + r.rollout.id,
                                                          group_id="late-" + r.rollout.group_id),
                                          run_id=run_id, round_id=round0) for r in gate_groups()[:16]])
    again = replay(ws.root, report["id"], workers=2)
    assert again["reproduced"], again["mismatches"]
    assert again["metrics"]["replayed"] == report["metrics"]
    result = CliRunner().invoke(app, ["backtests", "replay", report["id"][:12], "--workdir", str(ws.root)])
    assert result.exit_code == 0, result.output
    assert "reproduced" in result.output


def test_jsonl_import_into_fresh_workspace_gives_the_same_numbers(ws, tmp_path: Path):
    from evotrainer.cli.main import app

    report = run(ws, propose(ws, "partial-credit", PARTIAL_CREDIT))
    dump = tmp_path / "rollouts.jsonl"
    cli = CliRunner()
    out = cli.invoke(app, ["rollouts", "export", str(dump), "--run", "default", "--round", "0",
                           "--workdir", str(ws.root)])
    assert out.exit_code == 0, out.output
    fresh = workspace(tmp_path / "fresh")
    out = cli.invoke(app, ["rollouts", "import", str(dump), "--workdir", str(fresh.root)])
    assert out.exit_code == 0, out.output
    with Store.open(fresh.root) as store:
        assert store.count_rollouts() == 128
        branch = propose(fresh, "partial-credit", PARTIAL_CREDIT)
        imported = backtest(fresh.root, branch, store=store, workers=2)
    assert imported["metrics"] == report["metrics"]
    assert imported["rollout_ids_sha256"] == report["rollout_ids_sha256"]
    assert imported["decision"] == report["decision"] == "promote"


def test_metrics_match_hand_computation(tmp_path: Path):
    """Two groups, a candidate that rewards length, drops long rollouts and cuts at "STOP"."""
    rows = [rollout("a", 0, "ok", 10, completion="Answer: 4 STOP"), rollout("a", 1, "wrong", 20),
            rollout("a", 2, "empty", 0), rollout("a", 3, "ok", 30, marker=False),
            rollout("b", 0, "wrong", 5, marker=False, flags=("tampering",)),
            *[rollout("b", k, "wrong", 5, marker=False) for k in (1, 2, 3)]]
    with Store.open(tmp_path) as store:
        store.add_rollouts(rows)
        seed = base_sources()
        cand = {**seed,
                "reward.py": "def reward(r):\n    return {'length': r.num_tokens / 10}\n",
                "filters.py": "def keep_rollout(r):\n    return r.num_tokens <= 25\n"
                              "def keep_group(rs, rewards):\n    return True\n",
                "rollout.py": "PROMPT = '{{ question }}'\n"
                              "def stop(turns):\n    return 'stop word' if 'STOP' in turns[-1].content else None\n"}
        out = run_backtest(store, HarnessVersion("seed", seed), HarnessVersion("cand", cand), Selector())
    assert out.failure is None
    b, c = out.metrics["base"], out.metrics["candidate"]
    assert b == {"dead_group_ratio": 0.5, "effective_data_ratio": 0.5, "ordering_violations": 0.0,
                 "counterfactual_violations": 0.0, "proxy_auc": 1.0, "false_drop_rate": 0.0, "hacking_reward_mass": 0.0,
                 "dropped_live_rate": 0.0, "mean_tokens": 10.0, "n_rollouts": 8, "n_groups": 2, "errors": 0,
                 "sampled_dead_group_ratio": None}  # no run and round: no task history to weigh by
    assert c["dead_group_ratio"] == 0.5  # group b: every reward 0.5
    assert c["effective_data_ratio"] == 2 / 8  # only a1 and a2 are kept and carry an advantage
    assert c["ordering_violations"] == 1 / 4  # a1 (wrong, 2.0) above a0 (ok, 1.0)
    # Length pays whatever the outcome: a2 (empty, 0 tokens) rescored as a success still earns 0.0,
    # below a1's 2.0. Pairs: 2 in group a (two failures), 12 in group b (four, all 0.5: no order).
    assert c["counterfactual_violations"] == 1 / 14
    assert c["proxy_auc"] == 11 / 12  # a0 ties with nothing, beats 5 of 6 failures; a3 beats all
    assert c["false_drop_rate"] == 1.0  # a0 cut by stop(), a3 dropped by keep_rollout()
    assert c["hacking_reward_mass"] == 0.5 / 4.0  # b0 (tampering flag) of the kept positive reward
    assert c["mean_tokens"] == 40 / 6
    assert c["dropped_live_rate"] == 0.0  # group a (the only live one) keeps a1 and a2, both with an advantage


def test_group_advantages_match_trl():
    torch = pytest.importorskip("torch")
    rewards = [1.1, 0.1, 0.0, 0.4, 1.1, 0.3, 0.0, 0.0]
    t = torch.tensor(rewards, dtype=torch.float64)
    expected = (t - t.mean()) / (t.std() + 1e-4)  # TRL: Bessel-corrected std, + 1e-4
    assert group_advantages(rewards, "group") == pytest.approx(expected.tolist(), abs=1e-12)
    assert group_advantages(rewards, "none") == pytest.approx((t - t.mean()).tolist(), abs=1e-12)
    assert group_advantages([0.5] * 4) == [0.0] * 4


def test_selectors_parse_round_trip_and_pick_the_right_rollouts(ws, tmp_path: Path):
    ids = tmp_path / "ids.txt"
    ids.write_text("# ids\nmixed0-0\nmixed0-1\n\nmixed0-2\n")
    assert Selector.parse("ids=@" + str(ids)).ids == ("mixed0-0", "mixed0-1", "mixed0-2")
    sel = Selector.parse("run=default,round=1,limit=10")
    assert Selector.from_json(json.loads(json.dumps(sel.to_json()))) == sel
    for bad in ("round=x", "color=red", "run", "ids=a,limit=3"):
        with pytest.raises(ValueError):
            Selector.parse(bad)
    from evotrainer.backtest.engine import resolve

    with Store.open(ws.root) as store:
        assert resolve(store, Selector()).count == 256
        assert resolve(store, Selector(run="default", round=1)).count == 128
        assert resolve(store, Selector(limit=10)).count == 16  # rounded up to finish the group
        assert resolve(store, Selector.parse("ids=@" + str(ids))).count == 3
        with pytest.raises(ValueError, match="no run named"):
            resolve(store, Selector(run="nope"))
        with pytest.raises(ValueError, match="not in the store"):
            resolve(store, Selector(ids=("nope",)))


def test_scattered_groups_workers_and_chunk_sizes_do_not_change_the_numbers(tmp_path: Path):
    rows = gate_groups()
    seed = base_sources()
    cand = {**seed, "reward.py": LENGTH_BONUS}
    results = []
    for name, order in (("contiguous", rows), ("interleaved", rows[::2] + rows[1::2])):
        with Store.open(tmp_path / name) as store:
            store.add_rollouts(order)
            for workers, chunk in ((1, 4096), (2, 3)):
                out = run_backtest(store, HarnessVersion("a", seed), HarnessVersion("b", cand), Selector(),
                                   workers=workers, chunk_size=chunk)
                assert out.failure is None
                results.append(out.metrics)
    assert all(r == results[0] for r in results)


def test_cli_backtest_list_and_show(ws):
    from evotrainer.cli.main import app

    branch = propose(ws, "partial-credit", PARTIAL_CREDIT)
    cli = CliRunner()
    result = cli.invoke(app, ["backtest", branch, "--rollouts", "run=default,round=0", "--workdir",
                              str(ws.root), "--json", "gate.margin=0.5"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["decision"] == "reject" and report["gate"]["margin"] == 0.5  # 0.375 < 0.5
    listed = cli.invoke(app, ["backtests", "list", "--workdir", str(ws.root)])
    assert listed.exit_code == 0 and report["id"] in listed.output and "reject" in listed.output
    listed = json.loads(cli.invoke(app, ["backtests", "list", "--workdir", str(ws.root), "--json"]).stdout)
    assert [(b["id"], b["decision"]) for b in listed] == [(report["id"], "reject")]
    shown = cli.invoke(app, ["backtests", "show", report["id"], "--workdir", str(ws.root)])
    assert shown.exit_code == 0 and "dead_group_ratio" in shown.output and "REJECT" in shown.output
    bad = cli.invoke(app, ["backtest", branch, "--rollouts", "run=nope", "--workdir", str(ws.root)])
    assert bad.exit_code == 2 and "no run named" in bad.output


def test_gate_config_loads_with_overrides():
    cfg = load_config(CONFIGS_DIR / "math.yaml", ["gate.margin=0.05", "gate.call_timeout_s=2"])
    assert cfg.gate.margin == 0.05 and cfg.gate.call_timeout_s == 2 and cfg.gate.tolerance == 0.005
    assert math.isclose(GateConfig().margin, 0.02)


def test_a_curriculum_change_is_judged_on_the_groups_it_would_have_drawn(ws):
    """The shipped pass-rate-curriculum skill over round 1, whose tasks' history is round 0:
    mixed tasks (3/8 solved) keep weight 1, the other 10 tasks (0/8 or 8/8) drop to 0.2. Against
    the uniform base, a mixed task's group weighs (1/8)/(1/16) = 2 and any other (0.2/8)/(1/16) =
    0.4, so the dead share goes from 10/16 to 10 * 0.4 / (6 * 2 + 10 * 0.4) = 0.25. Rewards are
    unchanged, so every unweighted metric is too."""
    from evotrainer.skills import SkillLibrary

    repo = HarnessRepo(ws.harnesses)
    skill = SkillLibrary.load(ws.root).get("pass-rate-curriculum")
    assert skill.validation["targets"] == "sampled_dead_group_ratio"
    edits = skill.render(repo.sources("main"), {"band": [0.2, 0.8], "floor": 0.2})
    branch = repo.propose(1, "prc", edits, diagnosis="dead groups", targets="sampled_dead_group_ratio",
                          expected="fewer dead groups drawn").branch
    with Store.open(ws.root) as store:
        report = backtest(ws.root, branch, store=store, selector=Selector(run="default", round=1))
        early = backtest(ws.root, branch, store=store, selector=Selector(run="default", round=0), record=False)
    base, cand = report["metrics"]["base"], report["metrics"]["candidate"]
    assert base["sampled_dead_group_ratio"] == pytest.approx(10 / 16)
    assert cand["sampled_dead_group_ratio"] == pytest.approx(0.25)
    assert {k: v for k, v in base.items() if k != "sampled_dead_group_ratio"} == \
        {k: v for k, v in cand.items() if k != "sampled_dead_group_ratio"}
    assert report["decision"] == "promote" and report["target"] == "sampled_dead_group_ratio"
    # Round 0 was drawn with no history: nothing to weigh by, and the gate cannot promote on it.
    assert early["metrics"]["candidate"]["sampled_dead_group_ratio"] is None
    assert early["decision"] == "reject"
    with Store.open(ws.root) as store:
        assert replay(ws.root, report["id"], store=store)["reproduced"]
