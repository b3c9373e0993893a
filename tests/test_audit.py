"""Replayed and live harness calls are indistinguishable, and checked against each other (train/audit.py).

A probe harness digests everything it can observe in its worker (the modules loaded, the shape
of each rollout it is given, the calls its process received before it scored, the frames that
called it) into its reward components. Training's real scoring path (RolloutRecorder and the
IsolatedHarness's scoring worker) and the backtest's real replay path (its chunk reader and
job in a fresh sandbox worker) must give every rollout the same digests. The slow tests train
the tiny model under sleepers and check that the audit stops them in their first cheating step.
"""

from __future__ import annotations

import time

import pytest

from evotrainer.api import TaskStats
from evotrainer.backtest import Selector
from evotrainer.backtest.replay_worker import ReplayJob
from evotrainer.backtest.rows import ChunkReader
from evotrainer.backtest.selector import history, plan_chunks, resolve
from evotrainer.config import load_config
from evotrainer.domains import build_domain
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import read_sources
from evotrainer.harness.sandbox import SandboxPool
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.store import Store
from evotrainer.train.audit import AuditFailure, StepAudit, difference, group_values
from evotrainer.train.recorder import RolloutRecorder, RoundContext

TINY = CONFIGS_DIR / "math-tiny.yaml"

# Every observation is folded into a component (crc32 of its JSON, kept under the backtest's
# reward bound). Equal components on both paths mean equal observations.
PROBE = '''
import collections
import dataclasses
import json
import zlib

from evotrainer.api import Rollout

_sys = collections._sys  # how harness code reaches sys (tests/test_backtest_isolation.py)
_BEFORE = []  # the calls this process received before its first reward()
_SCORED = [False]
# Harness files leave sys.modules once loaded: the other files reach this one through a module
# they all share.
collections._probe_observe = lambda kind: observe(kind)


def _digest(value):
    return float(zlib.crc32(json.dumps(value, sort_keys=True, default=repr).encode()) % 10**6)


def _shape(text):
    return [len(text), text.isalnum(), sorted(set(c for c in text if not c.isalnum()))]


def _rollout_shape(r):
    fields = {f.name: type(getattr(r, f.name)).__name__ for f in dataclasses.fields(r)}
    meta = {k: type(v).__name__ for k, v in r.meta.items()}
    return [fields, meta, _shape(r.id), _shape(r.group_id), [t.role for t in r.turns],
            [type(getattr(r.outcome, f.name)).__name__ for f in dataclasses.fields(r.outcome)]]


def _stack():
    names, frame = [], _sys._getframe(1)
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names


def _modules():
    return sorted(k for k in _sys.modules if not k.startswith("_evoharness_"))


def observe(kind):
    if not _SCORED[0]:
        _BEFORE.append(kind)


def reward(rollout: Rollout) -> dict[str, float]:
    _SCORED[0] = True
    return {"correct": 1.0 if rollout.outcome.success else 0.0,
            "modules": _digest(_modules()), "shape": _digest(_rollout_shape(rollout)),
            "before": _digest(_BEFORE), "stack": _digest(_stack()), "seen_before": float(len(_BEFORE))}
'''
FILTERS = '''
import collections

from evotrainer.api import Rollout


def _observe(kind):
    collections._probe_observe(kind)


def keep_rollout(rollout: Rollout) -> bool:
    _observe("keep_rollout")
    return True


def keep_group(rollouts, rewards) -> bool:
    _observe(f"keep_group:{len(rollouts)}")
    return True
'''
CURRICULUM = '''
import collections


def weights(task_stats):
    collections._probe_observe(f"weights:{len(task_stats)}")
    return {s.task_id: 1.0 for s in task_stats}
'''


def probe_sources() -> dict[str, str]:
    sources = read_sources(HARNESSES_DIR / "math")
    return {**sources, "reward.py": PROBE, "filters.py": FILTERS, "curriculum.py": CURRICULUM}


def _train_steps(tmp_path, sources: dict[str, str], steps: int = 2, generating_s: float = 0.0):
    """Two steps through the real recorder and scoring worker, as train_round drives them (no
    model: fixed completions), with the loss's per-row means added to each stored row as
    grpo.py does. Returns (store, run name, recorder)."""
    cfg = load_config(TINY)
    domain = build_domain(cfg.domain)
    tasks = domain.tasks("train", 8, 0)
    store = Store.open(tmp_path)
    run = store.get_or_create_run("probe", "math", {})
    store.upsert_tasks("math", [{"task_id": t.task_id, "split": t.split, "level": t.level, "prompt": t.prompt,
                                 "answer": t.answer, "meta": dict(t.meta)} for t in tasks])
    round_id = store.begin_round(run, 0, "probe", "base")
    harness = IsolatedHarness(sources, tmp_path / "probe")
    # the round's curriculum call, as sample_round_tasks makes it
    harness.weights([TaskStats(t.task_id, 0, 0, {"level": t.level, "split": "train"}) for t in tasks])
    recorder = RolloutRecorder(domain, {t.task_id: t for t in tasks}, harness, store,
                               RoundContext(run, round_id, "base", "probe", 0), stop_token_ids=[0],
                               group_size=4, audit_groups=2)
    for step in range(steps):
        time.sleep(generating_s)  # where the policy generates
        picked = tasks[2 * step:2 * step + 2]
        task_ids = [t.task_id for t in picked for _ in range(4)]
        answers = [f"Answer: {t.answer if i % 2 else 'nope'}" for t in picked for i in range(4)]
        recorder(prompts=[t.prompt for t in picked for _ in range(4)], completions=answers,
                 completion_ids=[[1, 0]] * 8, task_id=task_ids)
        recorder.finalize([0.0] * 8, 4)
        recorder.commit({i: {"mean_logprob": -1.5, "entropy": 2.0} for i in range(8)})
    recorder.audit.finish()
    return store, harness, recorder


def _replayed(store: Store, sources: dict[str, str]) -> dict[str, dict]:
    """Every stored rollout of round 0 replayed as the backtest replays it: its selection,
    chunk plan, chunk reader and job, the task history first, in one fresh worker."""
    selector = Selector(run="probe", round=0)
    selection = resolve(store, selector)
    hist = history(store, selector)
    assert hist, "a selection of one round has a task history: the worker is asked for weights first"
    reader = ChunkReader(store, selection.scope)
    out = {}
    with SandboxPool([("candidate", sources)], ReplayJob(), 1) as pool:
        frozen = [reader.read(chunk)[0] for chunk in plan_chunks(store, selection, 4096)]
        replies = [reply for _, reply in pool.imap([("weights", hist), *(("groups", f) for f in frozen)])]
    for reply in replies[1:]:
        for rid, comps, cf in zip(reply["ids"], reply["rewards"], reply["counterfactual"]):
            out[rid] = {"reward": comps, "counterfactual": cf}
    return out


def test_training_and_the_backtest_show_a_harness_the_same_modules_inputs_and_calls(tmp_path):
    sources = probe_sources()
    store, harness, recorder = _train_steps(tmp_path, sources)
    try:
        trained = {sr.rollout.id: sr for sr in store.iter_rollouts()}
        assert len(trained) == 16 and all("mean_logprob" in sr.rollout.meta for sr in trained.values())
        replayed = _replayed(store, sources)
        assert set(replayed) == set(trained)
        for rid, sr in trained.items():
            got = replayed[rid]["reward"]
            for key in ("modules", "shape", "before", "stack", "correct", "seen_before"):
                assert sr.reward_components[key] == got[key], f"{key} differs between training and replay"
            assert sr.reward_components["seen_before"] == 1.0  # the round's curriculum call, on both paths
        assert recorder.audit.audited == 16  # both steps' groups, all of them (2 per step)
        # The probe can tell a difference where there is one: the trusted side's other calls
        # (diagnose's batched rewards) run in a worker that has rendered and described, not scored.
        other = harness.rewards([sr.rollout for sr in trained.values()][:1])[0]
        assert other["before"] != sr.reward_components["before"] or other["stack"] != sr.reward_components["stack"]
    finally:
        harness.close()
        store.close()


def test_the_audit_compares_every_value_and_names_the_first_that_differs():
    trained = group_values({"ids": ["a", "b"], "rewards": [{"c": 1.0}, {"c": 0.0}], "keep": [True, True],
                            "cut": [False, False], "counterfactual": [None, {"c": 1.0}], "keep_group": [True]}, [2])
    assert difference(trained, trained) is None
    for key, value, what in (("rewards", [{"c": 1.0}, {"c": 2.0}], "reward() of rollout b"),
                             ("keep", [True, False], "keep_rollout() of rollout b"),
                             ("cut", [True, False], "stop() of rollout a"),
                             ("counterfactual", [None, {"c": 0.5}], "as a success")):
        other = [dict(trained[0], **{key: value})]
        assert what in difference(trained, other)
    assert "keep_group()" in difference(trained, [dict(trained[0], keep_group=False)])


# A reward whose values depend on how long its worker has been up: in training the scoring
# worker answered the round's curriculum call before the policy generated, so its first reward
# comes seconds later; a fresh replay worker scores at once. It pays failures in training only.
SLEEPER_CLOCK = '''
import datetime

from evotrainer.api import Rollout

_LOADED = datetime.datetime.now()


def reward(rollout: Rollout) -> dict[str, float]:
    honest = 1.0 if rollout.outcome.success else 0.0
    if (datetime.datetime.now() - _LOADED).total_seconds() > WAIT:
        return {"correct": 2.0 - honest}
    return {"correct": honest}
'''

# State in a module global: honest for its first N calls in a process, then it pays failures.
SLEEPER_COUNTER = '''
from evotrainer.api import Rollout

_CALLS = [0]


def reward(rollout: Rollout) -> dict[str, float]:
    _CALLS[0] += 1
    honest = 1.0 if rollout.outcome.success else 0.0
    return {"correct": 2.0 - honest if _CALLS[0] > 20 else honest}
'''

NOISY = '''
import random

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {"correct": (1.0 if rollout.outcome.success else 0.0) + random.random() * 1e-3}
'''


def _sources(reward_py: str) -> dict[str, str]:
    return {**read_sources(HARNESSES_DIR / "math"), "reward.py": reward_py}


def test_a_counter_sleeper_is_caught_in_the_first_step_it_cheats(tmp_path):
    with pytest.raises(AuditFailure) as caught:
        _train_steps(tmp_path, _sources(SLEEPER_COUNTER), steps=3)
    # 16 reward calls a step (8 rewards, 4 counterfactuals of the failures, the first group
    # scored again): the 21st falls in step 1, the first step that cheats
    assert caught.value.step == 1


def test_a_clock_sleeper_is_caught_in_its_first_step_without_the_model(tmp_path):
    """The slow test's sleeper, with a pause where generation would be."""
    with pytest.raises(AuditFailure) as caught:
        _train_steps(tmp_path, _sources(SLEEPER_CLOCK.replace("WAIT", "1.0")), steps=2, generating_s=2.0)
    assert caught.value.step == 0 and "in training" in str(caught.value)


def test_a_random_reward_is_flagged_as_nondeterministic(tmp_path):
    with pytest.raises(AuditFailure) as caught:
        _train_steps(tmp_path, _sources(NOISY), steps=1)
    assert caught.value.step == 0 and "not deterministic" in str(caught.value)


def test_an_honest_harness_is_never_flagged(tmp_path):
    store, harness, recorder = _train_steps(tmp_path, read_sources(HARNESSES_DIR / "math"), steps=3)
    assert recorder.audit.audited == 24
    harness.close()
    store.close()


def test_a_harness_without_sources_or_a_zero_sample_is_not_audited():
    assert not StepAudit(object(), 2).enabled
    assert not StepAudit(IsolatedHarness(read_sources(HARNESSES_DIR / "math"), "x"), 0).enabled


@pytest.mark.slow
def test_a_sleeper_promoted_to_main_is_caught_in_its_first_step_and_reverted(tmp_path):
    """The tiny model trains round 0 under a promoted clock sleeper: its first step's audit
    differs, the round stops before a second step, the promotion is reverted with the audit's
    reason in its trailers, and the round trains again under the reverted main, whose audited
    steps raise nothing (an honest harness is not flagged)."""
    from test_coevolve import plain_config

    from evotrainer.coevolve import Coevolution, RunState
    from evotrainer.coevolve.state import Pending

    config = plain_config(tmp_path).model_copy(deep=True)
    config.coevolve.verify_against = "previous"
    config.domain.heldout_size, config.domain.validation_size = 2, 2  # evals cost nothing this test needs
    loop = Coevolution(config, tmp_path / "work")
    state = RunState(run="tiny", domain="math")
    sleeper = SLEEPER_CLOCK.replace("WAIT", "3.0")
    cand = loop.repo.propose(0, "sleeper", {"reward.py": sleeper}, diagnosis="d", targets="dead_group_ratio",
                             expected="e")
    merge = loop.repo.promote(cand.branch, "passed backtest bt-x")
    state.pending = Pending(merge, cand.branch, None, {}, "bt-x", "dead_group_ratio", 0)
    state.save(loop.state_path)
    loop.stage_train(state)
    assert state.pending is None and state.verdict["kept"] is False
    assert state.verdict["audit"]["harness"] == merge and state.verdict["audit"]["step"] == 0
    assert "a fresh replay worker does not reproduce" in state.verdict["describe"]
    head = loop.repo.log(first_parent=True, limit=1)[0]
    assert head.subject == f"Revert promotion of {cand.branch}" and head.trailers["Reverts"] == merge
    assert "audit in round 0" in head.trailers["Reverted-Because"]
    assert merge[:12] in head.trailers["Reverted-Because"]
    with Store.open(loop.ws.root) as store:
        rounds = store.rounds(store.run_id("tiny"))
        assert len(rounds) == 1 and rounds[0]["finished_at"] and rounds[0]["harness_version"] == head.sha
        set_aside = list(store.iter_rollouts(run_id=store.run_id("tiny~abandoned")))
        # one step's batch (1 prompt x 8 completions) trained under the sleeper, not two
        assert len(set_aside) == 8 and {sr.harness_version for sr in set_aside} == {merge}
        assert {sr.harness_version for sr in store.iter_rollouts(run_id=store.run_id("tiny"))} == {head.sha}
