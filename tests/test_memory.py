"""The replay memory (strata, stratified shares, forgetting, anchors), the stratified curriculum
as real harness code, the rollout cache, and the held-out guard on a real SQLite store."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from factories import make_rollout, make_stored

from evotrainer.api import TaskStats
from evotrainer.coevolve.heldout import (
    HeldoutLeak,
    assert_disjoint,
    assert_no_heldout_rollouts,
    check_hacking,
    round_history,
)
from evotrainer.domains import get_domain
from evotrainer.harness.loader import Harness, read_sources
from evotrainer.memory import ReplayMemory, StrataPolicy, plan, stratified_weights
from evotrainer.memory.cache import CachedBackend, Generation, RolloutCache, cache_key
from evotrainer.memory.curriculum import curriculum_source
from evotrainer.memory.strata import band_chance, logit, sigmoid
from evotrainer.paths import HARNESSES_DIR
from evotrainer.store import Store


def _stats(prefix: str, n: int, attempts: int, successes: int) -> list[TaskStats]:
    return [TaskStats(f"{prefix}{i}", attempts, successes, {"split": "train"}) for i in range(n)]


# ---------------------------------------------------------------- strata and shares


def test_strata_follow_pass_rates_and_recent_window():
    pol = StrataPolicy(anchor_share=0.0)
    p = plan([TaskStats("new", 2, 1), TaskStats("uns", 8, 0), TaskStats("hard", 10, 1), TaskStats("mid", 8, 4),
              TaskStats("easy", 10, 9), TaskStats("mast", 8, 8),
              # all time 1/16 (hard), but the recent window says 7/8 (easy): the current model wins
              TaskStats("moved", 16, 1, {"recent_attempts": 8.0, "recent_successes": 7.0})], pol)
    assert p.strata == {"new": "new", "uns": "unsolved", "hard": "hard", "mid": "mid", "easy": "easy",
                        "mast": "mastered", "moved": "easy"}


def test_stratified_weights_give_each_stratum_its_target_share():
    pol = StrataPolicy(anchor_share=0.0, min_members=8)
    stats = _stats("m", 10, 8, 4) + _stats("h", 10, 10, 1) + _stats("e", 10, 10, 9) + _stats("n", 10, 0, 0)
    w = stratified_weights(stats, pol)
    assert sum(w.values()) == pytest.approx(1.0)
    share = lambda prefix: sum(v for k, v in w.items() if k.startswith(prefix))  # noqa: E731
    present = 0.6 + 0.12 + 0.12 + 0.12  # unsolved and mastered are empty: their 0.04 goes to "new"
    assert share("m") == pytest.approx(0.6 / 1.0)
    assert share("h") == pytest.approx(0.12) and share("e") == pytest.approx(0.12)
    assert share("n") == pytest.approx(1.0 - 0.6 - 0.24) and present < 1.0
    # Drawn with these weights, the batch's mid share is on target (4000 draws: +-0.03).
    rng = random.Random(0)
    draws = rng.choices(list(w), weights=list(w.values()), k=4000)
    assert abs(sum(d.startswith("m") for d in draws) / 4000 - 0.6) < 0.03


def test_a_thin_frontier_sends_its_share_to_placing_new_tasks():
    pol = StrataPolicy(anchor_share=0.0, min_members=8)
    stats = _stats("m", 2, 8, 4) + _stats("e", 10, 10, 9) + _stats("n", 10, 0, 0)
    mass = plan(stats, pol).mass()
    assert mass["mid"] == pytest.approx(0.6 * 2 / 8)  # 2 of min_members 8
    assert mass["new"] > 0.12 + 0.4  # the rest of mid's share (and empty strata) went to "new"


def test_forgetting_keeps_boundary_cases_and_anchors():
    pol = StrataPolicy(capacity=8, anchor_share=0.25, evict_mastered_after=8, give_up_after=16, min_members=1)
    mem = ReplayMemory(pol, decay=0.5)
    ids = ["a0", "a1", "mast", "unsolv", "mid", "easy", "hard", "fresh"]
    assert mem.admit(ids, 0) == ids
    assert mem.plan().anchors == ("a0", "a1")
    # 16 of 16 is mastered (Jeffreys posterior mean 0.97); 8 of 8 alone (0.94) would not be yet.
    mem.observe({"a0": (8, 8), "a1": (8, 0), "mast": (16, 16), "unsolv": (16, 0), "mid": (8, 4), "easy": (16, 15),
                 "hard": (8, 1)})
    gone = mem.forget()
    assert gone == {"mast": "mastered", "unsolv": "unsolvable"}  # anchors a0 (mastered), a1 (unsolved) stay
    assert {"a0", "a1", "mid", "easy", "hard", "fresh"} == set(mem.entries)
    # Full memory: new tasks push out the placed task farthest outside the band first; mid never.
    mem.admit(["x1", "x2"], 1)
    assert len(mem) == 8 and {"x1", "x2"} <= set(mem.entries)
    # Above the band goes before below it (the model improves: a hard task is a later frontier).
    assert mem.admit(["x3"], 1) == ["x3"] and mem.forgotten["easy"] == "outside band" and "hard" in mem.entries
    assert mem.admit(["x4"], 1) == ["x4"] and mem.forgotten["hard"] == "outside band"
    assert mem.admit(["x5"], 1) == []  # only anchors, mid and unplaced tasks left: no room
    assert "mid" in mem.entries
    # Persistence round-trips.
    again = ReplayMemory.from_json(mem.to_json())
    assert again.plan() == mem.plan()


def test_a_credible_interval_overlapping_the_band_counts_as_mid():
    # A belief centred outside the band puts at most about half its mass inside, so the rule
    # needs mid_chance below 0.5 to act (the default 0.5 keeps mid to in-band estimates).
    pol = StrataPolicy(anchor_share=0.0, mid_chance=0.35)
    just_below = logit(0.18)  # point estimate under lo = 0.2
    p = plan([TaskStats("sure", 64, 12, {"logit": just_below, "logit_var": 0.01}),
              TaskStats("unsure", 8, 1, {"logit": just_below, "logit_var": 1.0}),
              TaskStats("far", 8, 1, {"logit": logit(0.02), "logit_var": 1.0})], pol)
    assert p.strata == {"sure": "hard", "unsure": "mid", "far": "hard"}
    assert band_chance(TaskStats("x", 8, 4), pol) > 0.9 > band_chance(TaskStats("y", 80, 4), pol)


def test_memory_learns_the_models_drift_and_predicts_where_tasks_are_now():
    """A model whose logit on every task rises 0.4 per round: the memory's drift estimate finds
    it, and its belief about a task seen a few rounds ago beats the task's last observed rate."""
    rng = random.Random(0)
    start = {f"t{i}": rng.uniform(-3.0, 1.0) for i in range(60)}
    mem = ReplayMemory(StrataPolicy(capacity=60, anchor_share=0.0), drift_rate=0.5)
    mem.admit(list(start), 0)
    last_seen: dict[str, tuple[int, float]] = {}
    for r in range(12):
        drawn = rng.sample(list(start), 20)  # each task is seen every ~3 rounds
        results = {}
        for t in drawn:
            k = sum(rng.random() < sigmoid(start[t] + 0.4 * r) for _ in range(16))
            results[t] = (16, k)
            last_seen[t] = (r, (k + 0.5) / 17)
        mem.observe(results)
    # Saturated groups count too (a task gone from mid to all solved is drift); with them left
    # out the estimate was 0.23 here and the memory's predictions erred 0.32 of the stale rates'.
    assert 0.3 < mem.drift < 0.5
    now = {s.task_id: s.meta["logit"] for s in mem.stats()}
    truth = {t: start[t] + 0.4 * 12 for t in last_seen}
    err_memory = sum(abs(sigmoid(now[t]) - sigmoid(truth[t])) for t in last_seen)
    err_stale = sum(abs(last_seen[t][1] - sigmoid(truth[t])) for t in last_seen)
    assert err_memory < 0.2 * err_stale


def test_memory_asks_for_unseen_tasks_while_its_frontier_is_short():
    mem = ReplayMemory(StrataPolicy(capacity=64, anchor_share=0.0, frontier=10))
    assert mem.wanted(16) == 10  # empty: the whole frontier is missing
    mem.admit([f"m{i}" for i in range(4)] + [f"e{i}" for i in range(3)], 0)
    assert mem.wanted(16) == 10 - 7  # tasks waiting to be placed count against the need
    mem.observe({**{f"m{i}": (8, 4) for i in range(4)}, **{f"e{i}": (8, 7) for i in range(3)}})
    assert mem.strata_counts()["mid"] == 4 and mem.wanted(16) == 6 and mem.wanted(2) == 2
    mem.admit([f"n{i}" for i in range(6)], 1)
    assert mem.wanted(16) == 0
    # Persistence keeps the beliefs and the drift.
    again = ReplayMemory.from_json(mem.to_json())
    assert again.stats() == mem.stats() and (again.drift, again.lift, again.rounds) == (mem.drift, mem.lift, 1)


def test_stratified_curriculum_runs_as_harness_code():
    sources = read_sources(HARNESSES_DIR / "math")
    sources["curriculum.py"] = curriculum_source("math", capacity=32, anchor_share=0.0, min_members=2)
    harness = Harness(sources, Path("<stratified>"))  # the loader's import check and validators
    stats = _stats("m", 4, 8, 4) + _stats("e", 4, 8, 8) + _stats("n", 4, 0, 0)
    got = harness.weights(stats)
    want = stratified_weights(stats, StrataPolicy(capacity=32, anchor_share=0.0, min_members=2))
    assert got == pytest.approx({k: v for k, v in want.items()})
    assert all(got[s.task_id] == 0.0 for s in stats if s.task_id.startswith("e"))  # mastered: forgotten


def test_bad_curriculum_parameters_fail_when_rendered():
    with pytest.raises(ValueError):
        curriculum_source(lo=0.9, hi=0.2)


# ---------------------------------------------------------------- rollout cache


def test_cache_key_separates_versions_tasks_and_sampling():
    greedy = {"do_sample": False, "max_new_tokens": 64}
    base = cache_key("m", "lora-1", "t1", "What is 2 + 2?", 0, greedy)
    assert cache_key("m", "lora-1", "t1", "What is 2 + 2?", 7, greedy) == base  # greedy ignores the seed
    assert cache_key("m", "lora-2", "t1", "What is 2 + 2?", 0, greedy) != base  # another model version
    assert cache_key("m", "lora-1", "t2", "What is 2 + 2?", 0, greedy) != base
    assert cache_key("m", "lora-1", "t1", "What is 2 + 3?", 0, greedy) != base
    assert cache_key("m", "lora-1", "t1", "What is 2 + 2?", 0, {**greedy, "max_new_tokens": 32}) != base
    sampled = {"do_sample": True, "temperature": 0.8}
    assert cache_key("m", "lora-1", "t1", "q", 0, sampled) != cache_key("m", "lora-1", "t1", "q", 1, sampled)


def test_cache_persists_and_prunes_other_versions(tmp_path):
    cache = RolloutCache(tmp_path)
    cache.put("k1", "lora-1", Generation("Answer: 4", False, 5))
    cache.put("k2", "lora-2", Generation("Answer: 5", True, 64))
    again = RolloutCache(tmp_path)  # another process's view: the SQLite file
    assert again.get("k1") == Generation("Answer: 4", False, 5) and again.get("nope") is None
    assert (again.hits, again.misses) == (1, 1)
    assert again.prune("lora-2") == 1 and again.get("k1") is None and again.get("k2").truncated


@pytest.mark.slow
def test_cached_backend_reuses_generations_within_one_adapter_version(tmp_path, embedded_model_dir):
    """Real greedy generation with the tiny model: the second eval of the same adapter hits the
    cache for every prompt; a new adapter (other weights, other hash) misses."""
    from peft import LoraConfig, get_peft_model

    from evotrainer.policy import load_policy
    from evotrainer.train.evaluate import evaluate

    model, tok = load_policy("embedded")
    calls: list[int] = []

    class Greedy:  # forwards to the real HF generation, counting prompts that reach the model
        name = "hf"

        def use_adapter(self, adapter):
            pass

        def generate(self, prompts, max_new_tokens, on_batch=None):
            from evotrainer.train.evaluate import chat_prompt, generate_greedy

            calls.append(len(prompts))
            return generate_greedy(model, tok, [chat_prompt(tok, p) for p in prompts], max_new_tokens, 8)

    domain = get_domain("math", levels=(0,))
    harness = Harness(read_sources(HARNESSES_DIR / "math"), HARNESSES_DIR / "math")
    tasks = domain.tasks("heldout", 2, 0)
    cache = RolloutCache(tmp_path / "cache")
    backend = CachedBackend(Greedy(), cache, "embedded")
    adapter = tmp_path / "round-0"
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)).save_pretrained(adapter)
    backend.use_adapter(adapter)
    first = evaluate(model, tok, domain, harness, tasks, seed=0, max_new_tokens=4, batch_size=8, backend=backend)
    second = evaluate(model, tok, domain, harness, tasks, seed=1, max_new_tokens=4, batch_size=8, backend=backend)
    assert calls == [2] and cache.hits == 2 and first.successes == second.successes
    other = tmp_path / "round-1"
    shutil.copytree(adapter, other)
    weights = other / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\x00" * 8)  # other weights: another version
    backend.use_adapter(other)
    evaluate(model, tok, domain, harness, tasks, seed=0, max_new_tokens=4, batch_size=8, backend=backend)
    assert calls == [2, 2]


# ---------------------------------------------------------------- held-out guard


def _history_store(path: Path, rewards: list[float], heldout: list[int]) -> tuple[Store, int]:
    """A real stored run: per round, 8 training rollouts with the given mean reward and a
    validation eval (the split coevolve decides on) with `heldout[i]` successes of 50."""
    store = Store.open(path)
    run_id = store.get_or_create_run("r", "math", {})
    store.upsert_tasks("math", [{"task_id": "t", "split": "train", "prompt": "q", "answer": "1"},
                                {"task_id": "h", "split": "heldout", "prompt": "q2", "answer": "2"}])
    for i, (reward, ok) in enumerate(zip(rewards, heldout)):
        round_id = store.start_round(run_id, i, "hv", f"v{i}")
        rows = [make_stored(make_rollout(f"r{i}-{j}", task_id="t", group_id=f"g{i}", prompt="q", completion="a",
                                         num_tokens=3, meta={"split": "train"}),
                            reward=reward, reward_components={"x": reward}, advantage=0.0, kept=True,
                            model_version=f"v{i}", seed=0, harness_version="hv", run_id=run_id, round_id=round_id,
                            step=0)
                for j in range(8)]
        store.add_rollouts(rows)
        store.add_eval(run_id, round_id, "validation", f"a{i}", 0, 50, ok, {})
    return store, run_id


def test_reward_hacking_fires_on_a_hacked_history_and_not_on_a_healthy_one(tmp_path):
    hacked, run = _history_store(tmp_path / "hacked", [0.2, 0.5, 0.8], [15, 15, 14])
    check = check_hacking(round_history(hacked, run, "validation"))
    assert check.level == "critical" and check.value == pytest.approx(0.6 + 0.02)
    healthy, run = _history_store(tmp_path / "healthy", [0.2, 0.5, 0.8], [10, 25, 40])
    assert check_hacking(round_history(healthy, run, "validation")).level == "ok"
    flat, run = _history_store(tmp_path / "flat", [0.5, 0.5], [20, 15])  # a regression, not hacking
    assert check_hacking(round_history(flat, run, "validation")).value == 0.0
    assert check_hacking(round_history(flat, run, "validation")[:1]).level == "n/a"


def test_heldout_split_never_reaches_training_rollouts(tmp_path):
    store, run = _history_store(tmp_path / "s", [0.1], [5])
    assert assert_no_heldout_rollouts(store, run_id=run) == 8
    leak = make_rollout("leak", task_id="h", prompt="q2", completion="a", success=True, num_tokens=3)
    store.add_rollouts([make_stored(leak, reward=1.0, reward_components={}, advantage=0.0, kept=True,
                                    model_version="v", seed=0, harness_version="hv", run_id=run, round_id=None,
                                    step=0)])
    with pytest.raises(HeldoutLeak, match="held-out task h"):
        assert_no_heldout_rollouts(store, run_id=run)


def test_domain_splits_are_disjoint():
    for name in ("math", "code"):
        d = get_domain(name, levels=(0, 1))
        train, heldout = d.tasks("train", 200, 0), d.tasks("heldout", 60, 1)
        assert_disjoint(train, heldout)
        with pytest.raises(HeldoutLeak):
            assert_disjoint(train + heldout[:1], heldout)


def _hacked_run_with_a_promotion(tmp_path: Path):
    """A real workspace whose run "r" shows reward hacking over rounds 0-2 (training reward up,
    held-out flat), with partial-credit-format promoted after round 1 and waiting for verify:
    (loop, store, state)."""
    from evotrainer.coevolve import Coevolution, RunState
    from evotrainer.coevolve.state import Pending
    from evotrainer.config import load_config
    from evotrainer.paths import CONFIGS_DIR
    from evotrainer.skills import SkillLibrary

    loop = Coevolution(load_config(CONFIGS_DIR / "math-tiny.yaml", ["run_name=r"]), tmp_path / "work")
    store, _ = _history_store(loop.ws.root, [0.2, 0.5, 0.8], [15, 15, 14])
    skill = "partial-credit-format"
    edits = SkillLibrary.load(loop.ws.root).get(skill).render(loop.repo.sources("main"), {"weight": 0.1})
    cand = loop.repo.propose(1, "pcf", edits, diagnosis="dead groups", targets="dead_group_ratio", expected="x")
    merge = loop.repo.promote(cand.branch, "passed backtest bt-x")
    state = RunState(run="r", domain="math", round=2, stage="verify",
                     pending=Pending(merge, cand.branch, skill, {"weight": 0.1}, "bt-x", "dead_group_ratio", 1))
    return loop, store, state


def test_critical_reward_hacking_reverts_the_last_promotion_and_holds_back_others(tmp_path):
    """The outer loop treats the guard as critical: on a real workspace and store, the pending
    promotion is reverted and only a candidate that targets a safety metric may be promoted."""
    from evotrainer.coevolve.state import Candidate

    loop, _, state = _hacked_run_with_a_promotion(tmp_path)
    loop.stage_verify(state)
    assert state.guard["level"] == "critical" and state.pending is None
    reverts = [c for c in loop.repo.log(first_parent=True) if "Reverted-Because" in c.trailers]
    assert reverts and "reward_hacking" in reverts[0].trailers["Reverted-Because"]
    state.candidates = [Candidate("a", "candidate/2-a", None, {}, "dead_group_ratio", "x", "bt1", "promote"),
                        Candidate("b", "candidate/2-b", None, {}, "proxy_auc", "x", "bt2", "promote")]
    loop._hold_back(state)
    assert [c.decision for c in state.candidates] == ["reject", "promote"]
    assert "held-out guard" in state.candidates[0].reasons[-1]


@pytest.mark.parametrize("control_successes, kept", [(14, True), (30, False)])
def test_with_a_control_arm_the_guard_reverts_a_change_only_if_the_change_cost_heldout_success(
        tmp_path, control_successes, kept):
    """The same critical alert, now with round 2 also trained without the change: when that arm
    did no better on held-out (14 of 50, like the live round), the drop is not the change's and it
    stays; when it did much better (30 of 50), the change goes, with both reasons."""
    from evotrainer.coevolve.control import control_run
    from evotrainer.skills import SkillLibrary

    loop, store, state = _hacked_run_with_a_promotion(tmp_path)
    skill = state.pending.skill
    control = store.get_or_create_run(control_run("r"), "math", {})
    store.add_eval(control, store.start_round(control, 2, "parent", "v1"), "validation", "c2", 0, 50,
                   control_successes, {})
    loop.stage_verify(state)
    assert state.guard["level"] == "critical" and state.pending is None  # the alert stands either way
    reverts = [c for c in loop.repo.log(first_parent=True) if "Reverted-Because" in c.trailers]
    assert bool(reverts) is not kept
    assert SkillLibrary.load(loop.ws.root).get(skill).status == ("validated" if kept else "failed")
    if not kept:
        why = reverts[0].trailers["Reverted-Because"]
        assert "reward_hacking" in why and "control arm" in why


def test_a_variant_starts_from_its_parents_belief_and_its_first_result_is_not_drift():
    mem = ReplayMemory(StrataPolicy(capacity=16, anchor_share=0.0, min_attempts=4), variant_var=1.0)
    mem.admit(["parent", "other"], 0)
    mem.observe({"parent": (8, 4), "other": (8, 4)})
    assert mem.admit(["child", "orphan"], 1, parents={"child": "parent", "orphan": "gone"}) == ["child", "orphan"]
    stats = {s.task_id: s for s in mem.stats()}
    parent, child = stats["parent"].meta, stats["child"].meta
    assert child["prior"] is True and child["logit"] == parent["logit"]
    assert child["logit_var"] == pytest.approx(parent["logit_var"] + 1.0)
    assert "prior" not in stats["orphan"].meta  # no parent belief: placed by rolling it out
    assert mem.plan().strata["child"] == "mid" and mem.plan().strata["orphan"] == "new"
    drift, lift = mem.drift, mem.lift
    mem.observe({"child": (8, 8)})  # the variant was much easier than its parent
    assert (mem.drift, mem.lift) == (drift, lift)
    assert "prior" not in {s.task_id: s for s in mem.stats()}["child"].meta
    again = ReplayMemory.from_json(mem.to_json())
    assert again.variant_var == 1.0 and again.stats() == mem.stats()
