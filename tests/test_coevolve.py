"""The outer loop's own decisions, on real git repos and a real SQLite store: promotion through
the gate, --approve saying no, verification that reverts a regression, and its control arm
(kill-and-resume: tests/test_resume.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from factories import make_rollout, make_stored
from typer.testing import CliRunner

from evotrainer.api import Rollout
from evotrainer.coevolve import Coevolution, RunState
from evotrainer.coevolve.loop import FAILURE_PROBE
from evotrainer.coevolve.state import Pending
from evotrainer.config import load_config
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.skills import SkillLibrary
from evotrainer.store import Store

TINY = CONFIGS_DIR / "math-tiny.yaml"


def _rollout(i: int, group: str, text: str, success: bool, truncated: bool = False) -> Rollout:
    kind = "ok" if success else ("truncated" if truncated else "wrong")
    return make_rollout(f"r{i:04d}", group_id=group, completion=text, success=success, kind=kind, num_tokens=12,
                        truncated=truncated, meta={"level": 0})


def seed_round(workdir: Path, run: str = "tiny", url: str | None = None) -> tuple[Store, int, int]:
    """Round 0 of `run` with 6 all-failing groups (well-formed and truncated answers mixed) and
    2 live groups: dead groups the partial-credit skill can rescue without ordering violations.
    `url`: another store than <workdir>/store.db (tests/test_store_postgres.py)."""
    store = Store.open(workdir, url)
    run_id = store.get_or_create_run(run, "math", {})
    round_id = store.start_round(run_id, 0, "seed", "base")
    rows, i = [], 0
    for g in range(8):
        for j in range(8):
            success = g >= 6 and j == 0
            text = "Answer: 4" if success else ("Answer: 5" if j % 2 else "Let me think about this for a")
            r = _rollout(i, f"g{g}", text, success, truncated=not success and j % 2 == 0)
            rows.append(make_stored(r, reward=float(success), advantage=0.0, kept=True, model_version="base", seed=0,
                                    harness_version="seed", run_id=run_id, round_id=round_id, step=0))
            i += 1
    store.add_rollouts(rows)
    return store, run_id, round_id


def plain_config(tmp_path: Path):
    """The tiny config over a correctness-only seed (the math seed with its format weight at 0),
    so that seed_round's dead groups are dead and partial credit can rescue them. seed_round's
    rollouts are written, not trained, so there is no adapter to pilot from: pilot_steps 0
    rejects the dynamics changes (longer-completions fires on its truncations) instead."""
    plain = tmp_path / "plain-seed"
    shutil.copytree(HARNESSES_DIR / "math", plain)
    yaml_file = plain / "harness.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("format: 0.1", "format: 0.0"))
    return load_config(TINY, [f"harness={plain}", "coevolve.pilot_steps=0"])


@pytest.fixture
def loop(tmp_path) -> Coevolution:
    return Coevolution(plain_config(tmp_path), tmp_path / "work")


def _state(loop: Coevolution, **kw) -> RunState:
    state = RunState(run="tiny", domain="math", **kw)
    state.save(loop.state_path)
    return state


def test_gate_promotes_one_candidate_with_evidence(loop):
    # The rules agent's first four proposals here: a dynamics change (rejected without a pilot),
    # two replayable ones and partial credit; the other four backtest what these already show.
    loop.config.coevolve.max_proposals = 4
    seed_round(loop.ws.root)
    state = _state(loop, stage="diagnose")
    loop.stage_diagnose(state)
    assert loop.report.get("dead_group_ratio").level == "critical"
    loop.stage_propose(state)
    assert any(c.skill == "partial-credit-format" for c in state.candidates)
    loop.stage_backtest(state)
    for c in state.candidates:  # every proposal has a report, rejected ones included
        assert (loop.ws.backtests / f"{c.backtest}.json").is_file() and c.decision in ("promote", "reject")
    loop.stage_promote(state)
    assert state.pending is not None and state.pending.round == 0
    log = loop.repo.log(first_parent=True)
    assert log[0].subject.startswith("Promote") and log[0].trailers.get("Backtest") == state.pending.backtest
    assert len([c for c in log if c.subject.startswith("Promote")]) == 1  # at most one per round


def test_a_round_records_what_each_stage_cost(loop, capsys):
    """Each stage's wall seconds go to coevolve.json's history and the round's store metrics, and
    `evotrainer status` and the report show them."""
    from typer.testing import CliRunner

    from evotrainer.cli.main import app
    from evotrainer.report.gather import rounds as report_rounds

    loop.config.coevolve.max_proposals = 2  # one backtest is enough to charge the stage
    store, run_id, _ = seed_round(loop.ws.root)
    store.close()
    state = _state(loop, stage="verify")
    loop.run_round(state)
    stages = state.history[-1]["stage_seconds"]
    assert set(stages) == {"verify", "diagnose", "propose", "backtest", "promote"}
    assert all(v >= 0 for v in stages.values()) and stages["backtest"] > 0
    assert state.stage_seconds == {}  # the next round starts its own account
    with Store.open(loop.ws.root) as store:
        [rnd] = store.rounds(run_id)
        assert rnd["metrics"]["stage_seconds"] == pytest.approx(stages)
        [row] = report_rounds(store, RunState.load(loop.state_path))
    assert row["cost"].startswith(f"{int(sum(stages.values()) // 60)}m") and "backtest" in row["cost"]
    out = CliRunner().invoke(app, ["status", "--workdir", str(loop.ws.root)])
    assert out.exit_code == 0, out.output
    assert "round cost" in out.output and "backtest" in out.output


def test_a_stage_is_charged_without_the_parts_it_timed_itself(loop):
    """A stage that times a part under its own name (the control arm, evaluation, a pilot) is
    charged only for the rest, so the parts add up to the round's wall time."""
    import time

    from evotrainer.coevolve.loop import _add_seconds

    state = RunState(run="tiny", domain="math")

    def stage(s):
        time.sleep(0.05)
        started = time.perf_counter()
        time.sleep(0.2)  # the part
        _add_seconds(s, "control", time.perf_counter() - started)

    loop._timed(state, "train", stage)
    assert 0.2 <= state.stage_seconds["control"] < 1.0
    assert 0.045 < state.stage_seconds["train"] < 0.2


def test_approve_no_keeps_main_unchanged(tmp_path):
    """--approve: the CLI prompt shows the diff and the backtest, and a typed "n" blocks promotion."""
    from evotrainer.cli.main import _ask_approval

    loop = Coevolution(plain_config(tmp_path), tmp_path / "work", approve=_ask_approval)
    loop.config.coevolve.max_proposals = 4  # partial credit, which the gate passes, is the fourth
    seed_round(loop.ws.root)
    before = loop.repo.resolve("main")
    state = _state(loop, stage="diagnose")
    for stage in (loop.stage_diagnose, loop.stage_propose, loop.stage_backtest):
        stage(state)
    assert any(c.decision == "promote" for c in state.candidates)
    with CliRunner().isolation(input="n\n") as streams:
        loop.stage_promote(state)
        shown = streams[1].getvalue().decode() + streams[0].getvalue().decode()
    assert "promote candidate/0-" in shown and "+++ b/" in shown  # the question and the diff
    assert loop.repo.resolve("main") == before and state.pending is None
    assert any("rejected by the reviewer" in " ".join(c.reasons) for c in state.candidates)


def promoted_after_round0(loop: Coevolution, weight: float = 0.1):
    """Round 0 stored (seed_round), partial-credit-format promoted after it, round 1 started:
    (store, run id, round 0 id, round 1 id, the candidate, the merge commit)."""
    store, run_id, round0 = seed_round(loop.ws.root)
    skill = SkillLibrary.load(loop.ws.root).get("partial-credit-format")
    rendered = skill.render(loop.repo.sources("main"), {"weight": weight})
    cand = loop.repo.propose(0, "pcf", rendered, diagnosis="dead groups", targets="dead_group_ratio",
                             expected="fewer dead groups")
    merge = loop.repo.promote(cand.branch, "passed backtest bt-x")
    return store, run_id, round0, store.start_round(run_id, 1, merge, "lora-x"), cand, merge


def test_regression_in_verification_round_reverts_and_fails_the_skill(loop):
    store, run_id, round0, round1, cand, merge = promoted_after_round0(loop)
    skill = "partial-credit-format"
    store.add_eval(run_id, round0, "validation", "a0", 0, 200, 120, {})
    store.add_eval(run_id, round1, "validation", "a1", 0, 200, 60, {})  # 0.60 -> 0.30: far beyond noise
    state = _state(loop, round=1, stage="verify",
                   pending=Pending(merge, cand.branch, skill, {"weight": 0.1}, "bt-x", "dead_group_ratio", 0))
    loop.stage_verify(state)
    assert state.pending is None
    log = loop.repo.log(first_parent=True)
    reverts = [c for c in log if "Reverted-Because" in c.trailers]
    assert reverts and "0.600 -> 0.300" in reverts[0].trailers["Reverted-Because"]
    assert "partial_format" not in loop.repo.sources("main")["reward.py"]
    assert SkillLibrary.load(loop.ws.root).get(skill).status == "failed"
    # Diagnostics were revised: main now carries the probe that would have flagged the change.
    harness = loop.repo.load("main")
    assert FAILURE_PROBE in {p.name for p in harness.probes}


def test_verification_within_noise_validates_the_skill(loop):
    store, run_id, round0 = seed_round(loop.ws.root)
    skill = "partial-credit-format"
    rendered = SkillLibrary.load(loop.ws.root).get(skill).render(loop.repo.sources("main"), {"weight": 0.05})
    cand = loop.repo.propose(0, "pcf", rendered, diagnosis="d", targets="dead_group_ratio", expected="e")
    merge = loop.repo.promote(cand.branch, "passed")
    round1 = store.start_round(run_id, 1, merge, "lora-x")
    store.add_eval(run_id, round0, "validation", "a0", 0, 128, 60, {})
    store.add_eval(run_id, round1, "validation", "a1", 0, 128, 58, {})
    state = _state(loop, round=1, stage="verify",
                   pending=Pending(merge, cand.branch, skill, {"weight": 0.05}, "bt-y", "dead_group_ratio", 0))
    loop.stage_verify(state)
    learned = SkillLibrary.load(loop.ws.root).get(skill)
    assert learned.status == "validated"
    assert learned.evidence[-1]["commit"] == merge and learned.evidence[-1]["backtest"] == "bt-y"
    assert (loop.ws.root / "skills" / skill / "skill.yaml").is_file()


def _eval(seed: int, n: int, solved: list[str]) -> dict:
    return {"seed": seed, "n": n, "successes": len(solved), "success_rate": len(solved) / n,
            "details": {"solved": solved}}


def test_paired_verification_counts_only_the_tasks_the_arms_disagree_on():
    from evotrainer.coevolve.verify import verify, verify_paired

    control = [_eval(0, 100, [f"t{i}" for i in range(50)])]
    live = [_eval(0, 100, [f"t{i}" for i in range(42)])]  # lost 8, gained none
    paired = verify_paired(control, live, 2.0)
    assert (paired.baseline, paired.live) == (0.5, 0.42) and paired.against == "control arm"
    # per-task differences: mean -0.08, variance 0.08 - 0.0064, standard error sqrt(0.0736 / 100)
    assert paired.noise == pytest.approx((0.0736 / 100) ** 0.5) and paired.regressed
    assert not verify(control, live, 2.0).regressed  # unpaired, the same drop is within noise
    # Swapping which tasks are solved at the same rates: 10 lost and 10 gained is noise.
    swapped = [_eval(0, 100, [f"t{i}" for i in range(10, 60)])]
    assert not verify_paired(control, swapped, 2.0).regressed
    # Evals without per-task results fall back to the unpaired test, still named as the control.
    bare = [{**e, "details": {}} for e in control]
    assert verify_paired(bare, live, 2.0).noise == verify(bare, live, 2.0).noise


def test_verification_against_the_control_arm_does_not_charge_drift_to_the_change(loop):
    """Held-out success fell from round 0 to round 1, but the control arm (round 1 without the
    change) fell just as far on the same tasks: drift, not the change, so the skill is kept."""
    from evotrainer.coevolve.control import control_run

    store, run_id, round0, round1, cand, merge = promoted_after_round0(loop)
    skill = "partial-credit-format"
    tasks = [f"h{i}" for i in range(200)]
    store.add_eval(run_id, round0, "validation", "a0", 0, 200, 120, {"solved": tasks[:120]})
    store.add_eval(run_id, round1, "validation", "a1", 0, 200, 60, {"solved": tasks[:60]})  # 0.60 -> 0.30
    control = store.get_or_create_run(control_run("tiny"), "math", {})
    c1 = store.start_round(control, 1, "parent", "lora-x")
    store.add_eval(control, c1, "validation", "c1", 0, 200, 62, {"solved": tasks[:62]})
    state = _state(loop, round=1, stage="verify",
                   pending=Pending(merge, cand.branch, skill, {"weight": 0.1}, "bt-x", "dead_group_ratio", 0))
    loop.stage_verify(state)
    assert SkillLibrary.load(loop.ws.root).get(skill).status == "validated"
    assert "partial_format" in loop.repo.sources("main")["reward.py"]
    # The same evidence judged against the previous round reverts it.
    loop.config = loop.config.model_copy(update={"coevolve": loop.config.coevolve.model_copy(
        update={"verify_against": "previous"})})
    state = _state(loop, round=1, stage="verify",
                   pending=Pending(merge, cand.branch, skill, {"weight": 0.1}, "bt-x", "dead_group_ratio", 0))
    loop.stage_verify(state)
    assert "partial_format" not in loop.repo.sources("main")["reward.py"]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [True, False])
def test_control_arm_trains_the_verified_round_again_without_the_change(tmp_path, embedded_model_dir, parallel):
    """Real rounds of the tiny config: after a promotion in round 0, stage train runs the control
    arm (round 1 without the change) beside round 1 (parallel: in a second process) or before
    it. Both start from round 0's adapter, draw the same prompts with the same seed and history,
    and differ only in harness; verify then compares them task by task."""
    from collections import Counter

    from evotrainer.coevolve.control import control_run

    config = plain_config(tmp_path).model_copy(deep=True)
    config.coevolve.parallel_arms = parallel
    # One step a round and a smaller held-out split: what is compared is which prompts, seeds,
    # adapters and harnesses each arm trained with, which one step shows as well as two.
    config.train.steps_per_round = 1
    config.domain.heldout_size = 4
    loop = Coevolution(config, tmp_path / "work")
    state = _state(loop)
    loop.stage_train(state)  # round 0
    parent = loop.repo.resolve("main")
    skill = "partial-credit-format"
    rendered = SkillLibrary.load(loop.ws.root).get(skill).render(loop.repo.sources("main"), {"weight": 0.1})
    cand = loop.repo.propose(0, "pcf", rendered, diagnosis="d", targets="dead_group_ratio", expected="e")
    merge = loop.repo.promote(cand.branch, "passed")
    state.round, state.pending = 1, Pending(merge, cand.branch, skill, {"weight": 0.1}, "bt-x", "dead_group_ratio", 0)
    loop.stage_train(state)  # the control arm, then round 1
    with Store.open(loop.ws.root) as store:
        main, control = store.run_id("tiny"), store.run_id(control_run("tiny"))
        live = list(store.iter_rollouts(run_id=main, round_index=1))
        ctl = list(store.iter_rollouts(run_id=control, round_index=1))
        round0 = list(store.iter_rollouts(run_id=main, round_index=0))
        assert live and Counter(r.rollout.task_id for r in live) == Counter(r.rollout.task_id for r in ctl)
        assert {r.model_version for r in live} == {r.model_version for r in ctl} != {r.model_version for r in round0}
        assert {r.harness_version for r in live} == {merge} and {r.harness_version for r in ctl} == {parent}
        assert {r.seed for r in live} == {r.seed for r in ctl}
        assert any("partial_format" in r.reward_components for r in live)
        assert not any("partial_format" in r.reward_components for r in ctl)
        assert len(store.rounds(control)) == 1 and store.rounds(control)[0]["finished_at"]
        # verify compares the arms on the validation split: the control arm answers only that
        assert {e["split"] for e in store.evals(control)} == {"validation"}
        assert {e["split"] for e in store.evals(main) if e["round_index"] == 1} == {"validation", "heldout"}
    # The round's cost adds up to its wall time: beside round 1, the control arm counts only its wait.
    assert state.stage_seconds["control"] >= 0
    assert (state.beside_seconds.get("control", 0) > state.stage_seconds["control"]) == parallel
    assert (loop.ws.root / "logs" / "tiny~control-round-1.log").is_file() == parallel
    loop.stage_train(state)  # resumed: both arms of round 1 are done, nothing trains again
    with Store.open(loop.ws.root) as store:
        assert store.count_rollouts(run_id=control) == len(ctl)
    loop.stage_verify(state)
    assert state.pending is None
    status = SkillLibrary.load(loop.ws.root).get(skill).status
    assert status in ("validated", "failed")


def test_a_change_reverted_against_its_control_arm_hands_the_next_round_the_arms_adapter(loop, monkeypatch):
    """Reverting a change undoes its training too: the next round starts from the control arm's
    adapter (trained without the change), not from the round trained with it."""
    from evotrainer.coevolve.control import control_run
    from evotrainer.train import loop as train_loop

    store, run_id, round0, round1, cand, merge = promoted_after_round0(loop)
    tasks = [f"h{i}" for i in range(200)]
    store.add_eval(run_id, round0, "validation", "a0", 0, 200, 120, {"solved": tasks[:120]})
    store.add_eval(run_id, round1, "validation", "a1", 0, 200, 60, {"solved": tasks[:60]})
    store.finish_round(round1, {}, "adapters/tiny/round-1")
    control = store.get_or_create_run(control_run("tiny"), "math", {})
    c1 = store.start_round(control, 1, "parent", "lora-x")
    store.add_eval(control, c1, "validation", "c1", 0, 200, 110, {"solved": tasks[:110]})  # far better
    store.finish_round(c1, {}, "adapters/tiny~control/round-1")
    state = _state(loop, round=1, stage="verify", pending=Pending(
        merge, cand.branch, "partial-credit-format", {"weight": 0.1}, "bt-x", "dead_group_ratio", 0))
    loop.stage_verify(state)
    assert "partial_format" not in loop.repo.sources("main")["reward.py"]
    assert state.start_adapter == "adapters/tiny~control/round-1"

    asked = []

    def no_model(model, adapter=None, trainable=False):
        asked.append(adapter)
        raise RuntimeError("stop here: only the adapter choice is under test")

    monkeypatch.setattr(train_loop, "load_policy", no_model)
    state.round = 2
    with pytest.raises(RuntimeError, match="stop here"):
        loop.stage_train(state)
    assert asked == ["adapters/tiny~control/round-1"]


def test_a_mention_of_the_trusted_probe_does_not_pre_empt_it(loop):
    """Issue 32: a promoted candidate whose diagnostics.py only *mentions* the probe's name (a
    comment, a decoy function of that name, a probe of that name that always reads 0) made the
    loop skip the trusted probe after a later revert. It is recognised by structure now."""
    decoy = loop.repo.sources("main")["diagnostics.py"] + f'''

# {FAILURE_PROBE}: the loop adds this probe after a live contradiction; it is here already.
def {FAILURE_PROBE}(rollouts, rewards):
    return 0.0


PROBES.append({{"name": "{FAILURE_PROBE}", "dimension": "result", "fn": {FAILURE_PROBE},
               "warn": 1e9, "critical": 2e9, "direction": "above"}})
'''
    first = loop.repo.propose(0, "notes", {"diagnostics.py": decoy}, diagnosis="d", targets="diagnostics",
                              expected="e")
    loop.repo.promote(first.branch, "diagnostics only")
    store, run_id, round0, round1, cand, merge = promoted_after_round0(loop)
    store.add_eval(run_id, round0, "validation", "a0", 0, 200, 120, {})
    store.add_eval(run_id, round1, "validation", "a1", 0, 200, 60, {})
    state = _state(loop, round=1, stage="verify",
                   pending=Pending(merge, cand.branch, "partial-credit-format", {"weight": 0.1}, "bt-x",
                                   "dead_group_ratio", 0))
    loop.stage_verify(state)
    assert [c for c in loop.repo.log(first_parent=True) if "Reverted-Because" in c.trailers]
    harness = loop.repo.load("main")
    (probe,) = [p for p in harness.probes if p.name == FAILURE_PROBE]  # the decoy's entry was dropped
    assert (probe.warn, probe.critical) == (0.05, 0.15)
    failures = [_rollout(i, "g", "wrong", False) for i in range(2)]
    assert probe.evaluate(failures, [0.5, 0.3]) == pytest.approx(0.4)  # the trusted code, not the decoy's 0.0
    harness.close()


@pytest.mark.parametrize("after, recognised", [
    ("", True),
    ("\n\ndef other(rollouts, rewards):\n    return 1.0\n", True),
    ("\nPROBES.pop()\n", False),
    ("\n\ndef failure_reward_mean(rollouts, rewards):\n    return 0.0\n", False),
    ("\nimport sys\n", False),
    ("\nglobals()['PRO' + 'BES'] = []\n", False),
])
def test_the_trusted_probe_is_recognised_by_structure(after, recognised):
    from evotrainer.coevolve.probes import failure_reward_probe, has_probe

    block = failure_reward_probe(FAILURE_PROBE)
    assert not has_probe(f"PROBES = []\n# {FAILURE_PROBE}\n", FAILURE_PROBE)
    assert not has_probe(f"PROBES = []\n'''{block}'''\n", FAILURE_PROBE)  # the text in a string
    assert has_probe("PROBES = []\n" + block + after, FAILURE_PROBE) is recognised


def test_a_candidate_breaking_the_worker_protocol_is_rejected_by_the_stage_and_its_resume(loop, tmp_path):
    """Issue 32: a reward.py that writes a well-formed frame of the wrong kind on its worker
    socket made coevolve's backtest stage (and every --resume after it) die with SandboxError."""
    from evotrainer.coevolve.state import Candidate

    seed_round(loop.ws.root)
    evil = loop.repo.sources("main")["reward.py"].replace("def reward(", "def _honest_reward(", 1) + '''

import random
import struct


def reward(rollout):
    frame = b'["ready", [{}, {}]]'
    for f in random._os.listdir("/proc/self/fd"):
        try:
            if random._os.readlink("/proc/self/fd/" + f).startswith("socket:"):
                random._os.write(int(f), struct.pack("!i", len(frame)) + frame)
        except OSError:
            pass
    return _honest_reward(rollout)
'''
    cand = loop.repo.propose(0, "frames", {"reward.py": evil}, diagnosis="d", targets="dead_group_ratio",
                             expected="e")
    state = _state(loop, stage="backtest", candidates=[
        Candidate("frames", cand.branch, None, {}, "dead_group_ratio", "e")])
    loop.stage_backtest(state)
    (c,) = state.candidates
    assert c.decision == "reject" and any("broke the message protocol" in r for r in c.reasons), c.reasons
    # --resume: a fresh loop on the same workspace reads the saved state and goes on
    again = Coevolution(loop.config, tmp_path / "work")
    resumed = RunState.load(again.state_path)
    resumed.candidates[0].backtest = None  # as if the kill came before the report was recorded
    again.stage_backtest(resumed)
    assert resumed.candidates[0].decision == "reject"
