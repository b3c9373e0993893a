"""Stratified replay sampling against uniform sampling, on a simulated policy that learns.

    python bench/memory_sampling.py                    # 20 rounds, seed 0, per-round table + figures
    python bench/memory_sampling.py --rounds 30 --seed 3 --json out.json

The simulation (seeded, no model): a pool of tasks with latent difficulty d_i; the policy has a
global ability theta and a per-task bonus b_i, and solves task i with probability
p_i = sigmoid(1.5 * (theta + b_i - d_i)). Each round draws `batch` prompts, samples `group`
rollouts of each (binomial in p_i) and learns the way GRPO does: only a group with both a
success and a failure carries a gradient, so theta grows with the share of such groups and a
task's own bonus grows when its group had signal. Both samplers run the same model from the
same seed; they differ only in which tasks they draw.

- uniform: every pool task alike (the seed curriculum's weights);
- stratified: evotrainer.memory.ReplayMemory (capacity, per-task pass-rate beliefs that
  predict the model's drift, forgetting, anchors, target share 0.6 for the mid stratum),
  admitting unseen pool tasks as its frontier runs short (ReplayMemory.wanted, at most --admit).

The figure of merit is the share of drawn prompts whose TRUE pass rate (the simulated model's,
not the memory's estimate) lies in the mid band [0.2, 0.8]. Simplifications: one global skill
plus per-task memorisation, no forgetting by the model, a fixed task pool.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
from dataclasses import dataclass

from evotrainer.memory import ReplayMemory, StrataPolicy, uniform_sample

BAND = (0.2, 0.8)
TARGET = 0.6  # the stratified policy's mid share
TARGET_BAND = (0.45, 0.75)  # what "keeps the share within the target band" means here


@dataclass
class World:
    """The simulated policy and task pool."""

    difficulty: dict[str, float]
    theta: float = 0.0
    bonus: dict[str, float] | None = None
    lr_global: float = 0.4
    lr_task: float = 0.1

    def __post_init__(self) -> None:
        self.bonus = {t: 0.0 for t in self.difficulty}

    def p(self, tid: str) -> float:
        return 1.0 / (1.0 + math.exp(-1.5 * (self.theta + self.bonus[tid] - self.difficulty[tid])))


def pool(n: int, rng: random.Random) -> dict[str, float]:
    # Most tasks are within reach, a long tail is not: difficulty = -1 + Exp(mean 2).
    return {f"t{i:04d}": -1.0 + rng.expovariate(0.5) for i in range(n)}


def mid_share(world: World, tids: list[str]) -> float:
    return sum(BAND[0] <= world.p(t) <= BAND[1] for t in tids) / len(tids) if tids else 0.0


def dead_share(results_by_draw: list[tuple[int, int]]) -> float:
    return sum(k in (0, n) for n, k in results_by_draw) / len(results_by_draw) if results_by_draw else 0.0


def simulate(rounds: int, seed: int, n_tasks: int, batch: int, group: int, capacity: int,
             admit: int) -> list[dict]:
    tasks = pool(n_tasks, random.Random(f"pool:{seed}"))
    order = list(tasks)
    random.Random(f"order:{seed}").shuffle(order)  # the stream new tasks arrive in
    uni, strat = World(dict(tasks)), World(dict(tasks))
    rng_u, rng_s = random.Random(f"u:{seed}"), random.Random(f"s:{seed}")
    policy = StrataPolicy(lo=BAND[0], hi=BAND[1], capacity=capacity, min_attempts=group // 2, min_members=8,
                          give_up_after=4 * group, evict_mastered_after=group, mastered_at=0.95,
                          anchor_share=0.1, anchor_mass=0.1,
                          shares={"mid": TARGET, "hard": 0.12, "easy": 0.12, "new": 0.12,
                                  "unsolved": 0.02, "mastered": 0.02})
    memory = ReplayMemory(policy, decay=0.5)
    stream = iter(order)
    rows = []
    for r in range(rounds):
        memory.forget()
        memory.admit(list(itertools.islice(stream, memory.wanted(admit))), r)
        drawn_u = uniform_sample(order, batch, rng_u)
        planned = memory.plan()
        drawn_s = memory.sample(batch, rng_s)
        row = {"round": r, "uniform_mid": mid_share(uni, drawn_u), "stratified_mid": mid_share(strat, drawn_s),
               "stratified_planned": planned.mass()["mid"],
               "stratified_est": sum(planned.strata[t] == "mid" for t in drawn_s) / len(drawn_s) if drawn_s else 0.0,
               "uniform_theta": uni.theta, "stratified_theta": strat.theta,
               "uniform_solved": statistics.fmean(uni.p(t) for t in order),
               "stratified_solved": statistics.fmean(strat.p(t) for t in order)}
        per_draw_u = [(group, k) for n, k in _per_draw(uni, drawn_u, group, rng_u)]
        per_draw_s = [(group, k) for n, k in _per_draw(strat, drawn_s, group, rng_s)]
        row["uniform_dead"], row["stratified_dead"] = dead_share(per_draw_u), dead_share(per_draw_s)
        memory.observe(_merge(drawn_s, per_draw_s))
        counts = memory.strata_counts()
        row.update(memory=len(memory), anchors=len(memory.plan().anchors), forgotten=len(memory.forgotten),
                   strata=counts, drift=memory.drift, lift=memory.lift,
                   true_drift=1.5 * (strat.theta - row["stratified_theta"]))
        rows.append(row)
    return rows


def _per_draw(world: World, tids: list[str], group: int, rng: random.Random) -> list[tuple[int, int]]:
    """Roll out the draw once and learn from it; (n, k) per drawn prompt, in draw order."""
    out = []
    signal = 0
    for tid in tids:
        p = world.p(tid)
        k = sum(rng.random() < p for _ in range(group))
        out.append((group, k))
        if 0 < k < group:
            signal += 1
            world.bonus[tid] += world.lr_task
    world.theta += world.lr_global * signal / max(1, len(tids))
    return out


def _merge(tids: list[str], per_draw: list[tuple[int, int]]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for tid, (n, k) in zip(tids, per_draw):
        n0, k0 = out.get(tid, (0, 0))
        out[tid] = (n0 + n, k0 + k)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64, help="prompts per round")
    ap.add_argument("--group", type=int, default=8, help="rollouts per prompt")
    ap.add_argument("--capacity", type=int, default=160)
    ap.add_argument("--admit", type=int, default=64,
                    help="unseen tasks admitted per round at most (the memory asks for what its frontier lacks)")
    ap.add_argument("--json", help="write the per-round rows here")
    a = ap.parse_args()
    rows = simulate(a.rounds, a.seed, a.tasks, a.batch, a.group, a.capacity, a.admit)
    print(f"mid band {BAND}, stratified target share {TARGET} (band {TARGET_BAND}); "
          f"{a.tasks} tasks, {a.batch} prompts x {a.group} rollouts per round, capacity {a.capacity}, seed {a.seed}")
    head = (f"{'round':>5} | {'uni mid':>7} {'uni dead':>8} {'uni pass':>8} | {'str plan':>8} {'str est':>7} "
            f"{'str mid':>7} {'str dead':>8} "
            f"{'str pass':>8} | {'drift':>5} {'lift':>5} {'true':>5} | {'mem':>4} {'forgot':>6}  strata (new/unsolved/hard/mid/easy/mastered)")
    print(head)
    print("-" * len(head))
    for r in rows:
        s = r["strata"]
        print(f"{r['round']:>5} | {r['uniform_mid']:>7.2f} {r['uniform_dead']:>8.2f} {r['uniform_solved']:>8.2f} | "
              f"{r['stratified_planned']:>8.2f} {r['stratified_est']:>7.2f} "
              f"{r['stratified_mid']:>7.2f} {r['stratified_dead']:>8.2f} {r['stratified_solved']:>8.2f} | "
              f"{r['drift']:>5.2f} {r['lift']:>5.2f} {r['true_drift']:>5.2f} | "
              f"{r['memory']:>4} {r['forgotten']:>6}  "
              f"{s['new']}/{s['unsolved']}/{s['hard']}/{s['mid']}/{s['easy']}/{s['mastered']}")
    later = rows[len(rows) // 2:]
    in_band = sum(TARGET_BAND[0] <= r["stratified_planned"] <= TARGET_BAND[1] for r in rows)
    in_band_true = sum(TARGET_BAND[0] <= r["stratified_mid"] <= TARGET_BAND[1] for r in rows)
    in_band_est = sum(TARGET_BAND[0] <= r["stratified_est"] <= TARGET_BAND[1] for r in rows)
    print("uni/str mid: share of drawn prompts whose TRUE pass rate is in the band; str plan: the memory's "
          "planned mid weight; str est: share of draws the memory placed in mid (its estimate); drift, lift: "
          "the memory's estimated logit gain per round (all tasks) and extra gain of a task just trained on; "
          "true: the simulated model's global logit gain that round")
    print(f"mid share, mean over all rounds:   uniform {statistics.fmean(r['uniform_mid'] for r in rows):.3f}  "
          f"stratified {statistics.fmean(r['stratified_mid'] for r in rows):.3f}")
    print(f"mid share, mean over 2nd half:     uniform {statistics.fmean(r['uniform_mid'] for r in later):.3f}  "
          f"stratified {statistics.fmean(r['stratified_mid'] for r in later):.3f}")
    print(f"mid share, last round:             uniform {rows[-1]['uniform_mid']:.3f}  "
          f"stratified {rows[-1]['stratified_mid']:.3f}")
    print(f"stratified rounds within {TARGET_BAND}: planned {in_band}/{len(rows)}, drawn-as-mid {in_band_est}/{len(rows)}, "
          f"true mid {in_band_true}/{len(rows)}")
    print(f"dead groups, mean over 2nd half:   uniform {statistics.fmean(r['uniform_dead'] for r in later):.3f}  "
          f"stratified {statistics.fmean(r['stratified_dead'] for r in later):.3f}")
    print(f"mean pool pass rate, last round:   uniform {rows[-1]['uniform_solved']:.3f}  "
          f"stratified {rows[-1]['stratified_solved']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
