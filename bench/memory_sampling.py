"""Stratified replay sampling against uniform sampling, on a simulated policy that learns, with and without frontier synthesis.

    python bench/memory_sampling.py                    # 30 rounds, seed 0, per-round table + figures
    python bench/memory_sampling.py --rounds 30 --seed 3 --json out.json
    python bench/memory_sampling.py --frontier 16      # also: both samplers with 16 variants per round

The simulation (seeded, no model): a pool of tasks with latent difficulty d_i; the policy has a
global ability theta and a per-task bonus b_i, and solves task i with probability
p_i = sigmoid(1.5 * (theta + b_i - d_i)). Each round draws `batch` prompts, samples `group`
rollouts of each (binomial in p_i) and learns the way GRPO does: only a group with both a
success and a failure carries a gradient, so theta grows with the share of such groups and a
task's own bonus grows when its group had signal. All samplers run the same model from the
same seed, each on its own copy of it; they differ only in which tasks they draw.

- uniform: every pool task alike (the seed curriculum's weights);
- stratified: evotrainer.memory.ReplayMemory (capacity, per-task pass-rate beliefs that
  predict the model's drift, forgetting, anchors, target share 0.6 for the mid stratum),
  admitting unseen pool tasks as its frontier runs short (ReplayMemory.wanted, at most --admit).

Frontier synthesis (--frontier N > 0 adds the arms uniform+frontier and stratified+frontier; the
two plain arms run exactly as with N = 0). It simulates self-questioning (evotrainer/frontier,
domain.frontier.per_round): after each round's results are observed, the arm makes N variant
tasks of its parents and adds them to its own pool. Assumptions, fixed before looking at results:
- parents are the tasks the arm's OWN estimates place in the band, closest to a pass rate of 0.5
  first, cycled over until N variants are made (the real synthesize_frontier picks and cycles the
  same way); none when the arm has no such task. The rule is the same for both arms, only the
  estimates differ: stratified uses its memory's "mid" stratum (band_chance >= mid_chance) and
  the memory's current pass-rate belief; uniform uses the pass rate of each task's last
  observation (a round's draws of it pooled), with at least `group // 2` attempts.
- a variant is similar to its parent but not identical: latent difficulty = the parent's
  + Normal(0, SIGMA), SIGMA = 0.3 (a logit-scale step, a fifth of the 1.5 slope's unit); it starts
  with bonus 0 (memorisation of the parent does not carry over, so a trained parent's variant is
  harder than the parent now is). Every variant is assumed valid (the trusted checker's rejects
  are not simulated); variants may themselves become parents.
- uniform+frontier samples its whole grown pool uniformly. stratified+frontier offers its waiting
  variants to the memory before unseen pool tasks, each with its parent (ReplayMemory.admit's
  `parents`), so the memory starts a variant from its parent's belief; ReplayMemory.wanted decides
  how many unseen tasks it takes per round, and variants not taken wait for a later round.
  stratified+frontier (blind) is the same arm with the parents withheld: its memory must place
  every variant by rolling it out first, as the memory did before variants carried priors.
- the noise of the variants' difficulties comes from one seeded stream per seed, the same for both
  frontier arms.

The figure of merit is the share of drawn prompts whose TRUE pass rate (the simulated model's,
not the memory's estimate) lies in the mid band [0.2, 0.8]. Simplifications: one global skill
plus per-task memorisation, no forgetting by the model; without --frontier, a fixed task pool.
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
SIGMA = 0.3  # spread of a variant's latent difficulty around its parent's (see module doc)
ARMS = ("uniform", "stratified", "uniform_frontier", "stratified_frontier_blind", "stratified_frontier")


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


def strata_policy(group: int, capacity: int) -> StrataPolicy:
    return StrataPolicy(lo=BAND[0], hi=BAND[1], capacity=capacity, min_attempts=group // 2, min_members=8,
                        give_up_after=4 * group, evict_mastered_after=group, mastered_at=0.95,
                        anchor_share=0.1, anchor_mass=0.1,
                        shares={"mid": TARGET, "hard": 0.12, "easy": 0.12, "new": 0.12,
                                "unsolved": 0.02, "mastered": 0.02})


class Arm:
    """One sampler on its own copy of the world: its pool, its draws, its estimates."""

    def __init__(self, name: str, tasks: dict[str, float], order: list[str], rng: random.Random,
                 memory: ReplayMemory | None, frontier: int, vary: random.Random | None,
                 priors: bool = True) -> None:
        self.name, self.world, self.rng, self.memory = name, World(dict(tasks)), rng, memory
        self.order = order  # the base pool, for the pool pass rate
        self.pool = list(order)  # what uniform draws from; grows with variants
        self.stream = iter(order)  # the base pool's unseen tasks, for the memory
        self.waiting: list[str] = []  # variants the memory has not taken yet
        self.frontier, self.vary = frontier, vary
        self.parent_of: dict[str, str] = {}  # variant -> parent, told to the memory when `priors`
        self.priors = priors
        self.last: dict[str, tuple[int, int]] = {}  # each task's last observation (uniform's estimates)
        self.made = 0
        self.parents = 0
        self.fresh_mid = 0.0  # share of the last round's variants whose TRUE pass rate was in the band

    def draw(self, r: int, batch: int, admit: int) -> list[str]:
        if self.memory is None:
            return uniform_sample(self.pool, batch, self.rng)
        self.memory.forget()
        want = self.memory.wanted(admit)
        offered = self.waiting[:want]
        offered += list(itertools.islice(self.stream, want - len(offered)))
        parents = {t: self.parent_of[t] for t in offered if t in self.parent_of} if self.priors else None
        taken = set(self.memory.admit(offered, r, parents=parents))
        self.waiting = [t for t in self.waiting if t not in taken]
        return self.memory.sample(batch, self.rng)

    def observe(self, drawn: list[str], per_draw: list[tuple[int, int]]) -> None:
        merged = _merge(drawn, per_draw)
        if self.memory is not None:
            self.memory.observe(merged)
        self.last.update(merged)

    def estimates(self, min_attempts: int) -> list[tuple[float, str]]:
        """(estimated pass rate, task) for the tasks this arm places in the band."""
        if self.memory is not None:
            strata = self.memory.plan().strata
            return [(1.0 / (1.0 + math.exp(-s.meta["logit"])), s.task_id) for s in self.memory.stats()
                    if strata.get(s.task_id) == "mid" and "logit" in s.meta]
        return [(k / n, t) for t, (n, k) in self.last.items() if n >= min_attempts and BAND[0] <= k / n <= BAND[1]]

    def synthesize(self, min_attempts: int) -> None:
        """Self-questioning: `frontier` variants of the in-band tasks, closest to 0.5 first, cycled."""
        if not self.frontier:
            return
        parents = [t for _, t in sorted((abs(rate - 0.5), t) for rate, t in self.estimates(min_attempts))]
        self.parents = len(parents)
        self.fresh_mid = 0.0
        if not parents:
            return
        fresh = []
        for parent in itertools.islice(itertools.cycle(parents), self.frontier):
            tid = f"v{self.made:04d}"
            self.made += 1
            self.world.difficulty[tid] = self.world.difficulty[parent] + self.vary.gauss(0.0, SIGMA)
            self.world.bonus[tid] = 0.0
            self.pool.append(tid)
            self.waiting.append(tid)
            self.parent_of[tid] = parent
            fresh.append(tid)
        self.fresh_mid = mid_share(self.world, fresh)


def simulate(rounds: int, seed: int, n_tasks: int, batch: int, group: int, capacity: int,
             admit: int, frontier: int = 0) -> list[dict]:
    tasks = pool(n_tasks, random.Random(f"pool:{seed}"))
    order = list(tasks)
    random.Random(f"order:{seed}").shuffle(order)  # the stream new tasks arrive in
    arms = {"uniform": Arm("uniform", tasks, order, random.Random(f"u:{seed}"), None, 0, None),
            "stratified": Arm("stratified", tasks, order, random.Random(f"s:{seed}"),
                              ReplayMemory(strata_policy(group, capacity), decay=0.5), 0, None)}
    if frontier:
        arms["uniform_frontier"] = Arm("uniform_frontier", tasks, order, random.Random(f"uf:{seed}"), None,
                                       frontier, random.Random(f"vary:{seed}"))
        for name, priors in (("stratified_frontier_blind", False), ("stratified_frontier", True)):
            arms[name] = Arm(name, tasks, order, random.Random(f"sf:{seed}"),
                             ReplayMemory(strata_policy(group, capacity), decay=0.5), frontier,
                             random.Random(f"vary:{seed}"), priors)
    strat, memory = arms["stratified"], arms["stratified"].memory
    rows = []
    for r in range(rounds):
        drawn = {name: arm.draw(r, batch, admit) for name, arm in arms.items()}
        planned = memory.plan()
        drawn_s = drawn["stratified"]
        row = {"round": r, "stratified_planned": planned.mass()["mid"],
               "stratified_est": sum(planned.strata[t] == "mid" for t in drawn_s) / len(drawn_s) if drawn_s else 0.0}
        for name, arm in arms.items():
            row[f"{name}_mid"] = mid_share(arm.world, drawn[name])
            row[f"{name}_theta"] = arm.world.theta
            row[f"{name}_solved"] = statistics.fmean(arm.world.p(t) for t in order)
        for name, arm in arms.items():
            per_draw = _per_draw(arm.world, drawn[name], group, arm.rng)
            row[f"{name}_dead"] = dead_share(per_draw)
            arm.observe(drawn[name], per_draw)
            arm.synthesize(group // 2)
            if arm.frontier:
                row[f"{name}_pool"], row[f"{name}_parents"] = len(arm.pool), arm.parents
                row[f"{name}_memory"] = len(arm.memory) if arm.memory is not None else None
                row[f"{name}_fresh_mid"], row[f"{name}_waiting"] = arm.fresh_mid, len(arm.waiting)
        counts = memory.strata_counts()
        row.update(memory=len(memory), anchors=len(memory.plan().anchors), forgotten=len(memory.forgotten),
                   strata=counts, drift=memory.drift, lift=memory.lift,
                   true_drift=1.5 * (strat.world.theta - row["stratified_theta"]))
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


def summary(rows: list[dict]) -> None:
    """True mid share per arm: all rounds, 2nd half, last round, rounds within TARGET_BAND."""
    later = rows[len(rows) // 2:]
    print(f"{'true mid share':<20} {'all rounds':>10} {'2nd half':>9} {'last':>6} {'in band':>8} {'dead 2nd half':>14}")
    for name in ARMS:
        if f"{name}_mid" not in rows[0]:
            continue
        in_band = sum(TARGET_BAND[0] <= r[f"{name}_mid"] <= TARGET_BAND[1] for r in rows)
        print(f"{name.replace('_', '+'):<20} {statistics.fmean(r[f'{name}_mid'] for r in rows):>10.3f} "
              f"{statistics.fmean(r[f'{name}_mid'] for r in later):>9.3f} {rows[-1][f'{name}_mid']:>6.3f} "
              f"{in_band:>5}/{len(rows):<2} {statistics.fmean(r[f'{name}_dead'] for r in later):>14.3f}")


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
    ap.add_argument("--frontier", type=int, default=0,
                    help="variant tasks synthesized per round from each arm's in-band tasks; > 0 adds the "
                         "uniform+frontier and stratified+frontier arms (see the module doc)")
    ap.add_argument("--json", help="write the per-round rows here")
    a = ap.parse_args()
    if a.frontier < 0:
        ap.error("--frontier must be >= 0")
    rows = simulate(a.rounds, a.seed, a.tasks, a.batch, a.group, a.capacity, a.admit, a.frontier)
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
    if a.frontier:
        print(f"\nfrontier synthesis: {a.frontier} variants per round per arm, difficulty = parent's + "
              f"Normal(0, {SIGMA}); true mid share of drawn prompts per round")
        head = (f"{'round':>5} | {'uni':>5} {'str':>5} {'uni+f':>5} {'blind':>5} {'str+f':>5} | {'uni+f pool':>10} {'parents':>7} "
                f"{'new mid':>7} | {'str+f pool':>10} {'parents':>7} {'new mid':>7} {'waiting':>7} {'mem':>4}")
        print(head)
        print("-" * len(head))
        for r in rows:
            print(f"{r['round']:>5} | {r['uniform_mid']:>5.2f} {r['stratified_mid']:>5.2f} "
                  f"{r['uniform_frontier_mid']:>5.2f} {r['stratified_frontier_blind_mid']:>5.2f} "
                  f"{r['stratified_frontier_mid']:>5.2f} | "
                  f"{r['uniform_frontier_pool']:>10} {r['uniform_frontier_parents']:>7} "
                  f"{r['uniform_frontier_fresh_mid']:>7.2f} | "
                  f"{r['stratified_frontier_pool']:>10} {r['stratified_frontier_parents']:>7} "
                  f"{r['stratified_frontier_fresh_mid']:>7.2f} {r['stratified_frontier_waiting']:>7} "
                  f"{r['stratified_frontier_memory']:>4}")
        print("blind: stratified+frontier without the variants' parents (no priors); pool: the arm's tasks after this round's variants; parents: tasks it placed in the band this round; "
              "new mid: share of this round's variants whose TRUE pass rate is in the band when made; waiting: "
              "variants the memory has not taken yet")
    print()
    summary(rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
