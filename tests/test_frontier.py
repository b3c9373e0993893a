"""Self-questioning: frontier variants are validated by the trusted checkers (math recomputed,
code references run against their hidden tests in the real sandbox), held-out stays out, and
duplicates are dropped; on a real SQLite store."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from factories import make_rollout, make_stored

from evotrainer.api import TaskStats
from evotrainer.domains import get_domain
from evotrainer.domains.base import Task
from evotrainer.domains.code import task_from_key as code_task
from evotrainer.domains.math import task_from_key as math_task
from evotrainer.frontier import Deduper, check_task, frontier_tasks, in_band, synthesize_frontier, variant
from evotrainer.store import Store


def _train_key(prefix: str, make, keys) -> Task:
    for k in keys:
        t = make(f"{prefix}{k}", 0.2)
        if t.split == "train":
            return t
    raise AssertionError("no train key")


def test_math_variants_are_recomputed_and_wrong_answers_rejected():
    parent = _train_key("L2:", math_task, [f"{a} * {b} + 7" for a in range(2, 12) for b in range(2, 12)])
    child = variant(parent, random.Random(1), 0.2)
    assert child.meta["expression"] != parent.meta["expression"] or child.prompt != parent.prompt
    good = replace(child, split="train")
    assert check_task(good).ok
    wrong = replace(good, answer=str(int(good.answer) + 1))
    verdict = check_task(wrong)
    assert not verdict.ok and verdict.reason.startswith("wrong_answer")
    neg = Task("m-neg", "math", "train", 0, "What is 3 - 5?", "-2", {"expression": "3 - 5"})
    assert check_task(neg).reason.startswith("negative_step")
    frac = Task("m-frac", "math", "train", 3, "...", "2", {"expression": "7 / 2 + 1"})
    assert check_task(frac).reason.startswith("not_integer")
    held = replace(good, split="heldout")
    assert check_task(held).reason.startswith("heldout_split")


def test_code_reference_must_pass_its_hidden_tests_in_the_sandbox():
    parent = _train_key("L1:keep_if:", code_task, [f'{{"op": ">", "t": {t}}}' for t in range(-10, 30)])
    assert check_task(parent).ok  # the generated reference passes, a None-returning stub does not
    broken = replace(parent, answer=parent.answer.replace(">", "<"))
    verdict = check_task(broken)
    assert not verdict.ok and verdict.reason.startswith("reference_fails")
    trivial = replace(parent, meta={**parent.meta, "tests": ("assert keep_if([1]) is None",)})
    assert check_task(trivial).reason.startswith("reference_fails")
    lenient = replace(parent, answer="def keep_if(nums):\n    return None\n",
                      meta={**parent.meta, "tests": ("assert True",)})
    assert check_task(lenient).reason.startswith("trivial_passes")


def test_duplicates_are_dropped_by_normalised_prompt():
    t = math_task("L0:3 + 4", 0.2)
    dedupe = Deduper([t])
    respaced = replace(t, task_id="other", prompt="  what is 3  +  4? ", meta={})
    assert dedupe.seen(respaced) == t.task_id
    assert dedupe.seen(math_task("L0:3 + 5", 0.2)) is None


def _seed_store(path: Path, domain: str, n: int) -> tuple[Store, list[Task], list[Task]]:
    """Train tasks with pass rates 0/8 .. 8/8 and some held-out tasks, stored for real."""
    d = get_domain(domain, levels=(0, 1))
    train, heldout = d.tasks("train", n, 0), d.tasks("heldout", 4, 0)
    store = Store.open(path)
    store.upsert_tasks(domain, [{"task_id": t.task_id, "split": t.split, "level": t.level, "prompt": t.prompt,
                                 "answer": t.answer, "meta": {k: list(v) if isinstance(v, tuple) else v
                                                              for k, v in t.meta.items()}}
                                for t in train + heldout])
    rows = []
    for i, t in enumerate(train + heldout):
        wins = i % 9
        for j in range(8):
            ok = j < wins
            rows.append(make_stored(make_rollout(f"{t.task_id}-{j}", task_id=t.task_id, group_id=f"g{i}", domain=domain,
                                                 prompt="p", completion="c", success=ok)))
    store.add_rollouts(rows)
    return store, train, heldout


def test_math_frontier_synthesis_end_to_end(tmp_path):
    store, train, heldout = _seed_store(tmp_path / "m", "math", 18)
    stats = store.task_stats("math")
    parents = in_band(stats, (0.2, 0.8))
    heldout_ids = {t.task_id for t in heldout}
    assert parents and all(0.2 <= s.pass_rate <= 0.8 and s.task_id not in heldout_ids for s in parents)
    report = synthesize_frontier(store, "math", band=(0.2, 0.8), n=10, seed=0, known=heldout)
    assert len(report.accepted) == 10
    assert {t.meta["parent"] for t in report.accepted} <= {s.task_id for s in parents}
    known = {t.task_id for t in train + heldout}
    assert not known & {t.task_id for t in report.accepted}
    assert len({t.prompt for t in report.accepted}) == 10
    stored = frontier_tasks(store, "math")
    assert {t.task_id for t in stored} == {t.task_id for t in report.accepted}
    assert all(t.split == "train" for t in stored)
    # Every rejection has a named reason; a second run with the same seed only finds duplicates.
    again = synthesize_frontier(store, "math", band=(0.2, 0.8), n=10, seed=0)
    assert all(r.split(":")[0] in ("duplicate", "heldout_split", "negative_step", "wrong_answer")
               for _, _, r in again.rejected)
    assert "duplicate" in again.reasons()


def test_code_frontier_synthesis_validates_in_the_sandbox(tmp_path):
    store, _, _ = _seed_store(tmp_path / "c", "code", 9)
    report = synthesize_frontier(store, "code", band=(0.2, 0.8), n=3, seed=0)
    assert len(report.accepted) == 3
    assert all(check_task(t).ok for t in report.accepted)


def test_jsonl_tasks_have_no_generator(tmp_path):
    store = Store.open(tmp_path / "g")
    store.upsert_tasks("math", [{"task_id": "gsm-1", "split": "train", "prompt": "Sam has 3 apples...",
                                 "answer": "5", "meta": {"key": "gsm:sam has 3 apples"}}])
    store.add_rollouts([make_stored(make_rollout(f"r{j}", task_id="gsm-1", prompt="p", completion="c", success=j < 4))
                        for j in range(8)])
    report = synthesize_frontier(store, "math", n=2)
    assert not report.accepted and report.reasons() == {"no_generator": 1}


def test_tasks_frontier_cli(tmp_path):
    from typer.testing import CliRunner

    from evotrainer.cli.tasks import app

    store, _, _ = _seed_store(tmp_path, "math", 9)
    store.close()
    result = CliRunner().invoke(app, ["frontier", "--workdir", str(tmp_path), "--n", "3"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "frontier" / "math-seed0.json").is_file()
    assert CliRunner().invoke(app, ["frontier", "--workdir", str(tmp_path), "--band", "0.9,0.1"]).exit_code == 2
    assert CliRunner().invoke(app, ["frontier", "--workdir", str(tmp_path / "none")]).exit_code == 2


def test_training_adds_frontier_tasks_before_each_round_and_keeps_them_on_resume(tmp_path):
    """domain.frontier.per_round: the loop synthesizes validated variants from this run's pass
    rates before a round, the round's recorder and sampler see them, and a resumed session
    (a new open_session) loads them back from the store."""
    from evotrainer.config import load_config
    from evotrainer.paths import CONFIGS_DIR
    from evotrainer.train.loop import add_frontier_tasks, open_session, sample_round_tasks

    cfg = load_config(CONFIGS_DIR / "math-tiny.yaml", ["domain.frontier.per_round=4", "domain.train_size=18"])
    session = open_session(cfg, tmp_path)
    add_frontier_tasks(session, 0)  # round 0: no pass rates yet, nothing to place
    assert len(session.train_tasks) == 18
    rows = []
    for i, t in enumerate(session.train_tasks):
        for j in range(8):
            ok = j < i % 9
            rows.append(make_stored(make_rollout(f"{t.task_id}-{j}", task_id=t.task_id, group_id=f"g{i}", prompt="p",
                                                 completion="c", success=ok), run_id=session.run_id))
    session.store.add_rollouts(rows)
    add_frontier_tasks(session, 1)
    new = [t for t in session.train_tasks if t.meta.get("origin") == "frontier"]
    assert len(new) == 4 and len(session.train_tasks) == 22
    heldout = {t.task_id for ts in session.heldout.values() for t in ts}
    assert not heldout & {t.task_id for t in new}
    for t in new:  # the trusted checker grades them like any train task
        assert session.domain.check(t, f"Answer: {t.answer}", False).success
    drawn = {t.task_id for t in sample_round_tasks(session, 400, seed=0)}
    assert drawn & {t.task_id for t in new}  # the curriculum samples them
    session.store.close()
    again = open_session(cfg, tmp_path)
    assert {t.task_id for t in new} <= {t.task_id for t in again.train_tasks}
    again.store.close()
    with pytest.raises(Exception, match="frontier.per_round is for math and code"):
        load_config(CONFIGS_DIR / "swe.yaml", ["domain.frontier.per_round=2"])


def test_parents_are_picked_by_the_memorys_current_belief_when_there_is_one():
    """A task solved 0 of 8 then 8 of 8 has an all-time rate of 0.5, but the replay memory's
    belief (meta logit) says it is mastered now: it is not a frontier parent."""
    import math

    stale = TaskStats("t-stale", 16, 8, {"split": "train", "logit": 3.0})
    live = TaskStats("t-live", 16, 3, {"split": "train", "logit": math.log(0.45 / 0.55)})
    counts_only = TaskStats("t-counts", 8, 4, {"split": "train"})
    assert [s.task_id for s in in_band([stale, live, counts_only], (0.2, 0.8))] == ["t-counts", "t-live"]
