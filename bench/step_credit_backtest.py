"""Backtest of step-level credit: dead groups and ordering, outcome-only GRPO vs step credit.

    python bench/step_credit_backtest.py --workdir evotrainer-work   # stored rollouts with meta step_labels
    python bench/step_credit_backtest.py --demo                      # a seeded synthetic set (no store)

For each group, the outcome advantage is TRL's (group_advantages of the stored training reward, or
of verified success in the demo); step credit is evotrainer.train.credit.step_advantages. A group
is dead when every step advantage of every rollout is zero; an ordering violation is a
(verified success, verified failure) pair of one group where the failure's return (its first
step's advantage: the sum of all its step rewards) is strictly higher. The demo's judge is noisy on
purpose: a step of a success is GOOD with p=0.75, of a failure with p=0.4.
"""

from __future__ import annotations

import argparse
import random
from collections import defaultdict
from collections.abc import Sequence

from evotrainer.backtest.metrics import EPS, group_advantages
from evotrainer.train.credit import label_values, step_advantages


def metrics(groups: Sequence[Sequence[tuple[bool, float, list[float] | None]]], alpha: float | None) -> dict:
    """groups of (verified success, training reward, step labels); alpha None = outcome only."""
    dead = pairs = violations = 0
    for group in groups:
        outcome = group_advantages([reward for _, reward, _ in group])
        if alpha is None:
            steps = [[a] for a in outcome]
        else:
            steps = step_advantages([labels for _, _, labels in group], outcome, alpha)
        dead += all(abs(x) <= EPS for s in steps for x in s)
        wins = [s[0] for (ok, _, _), s in zip(group, steps) if ok]
        losses = [s[0] for (ok, _, _), s in zip(group, steps) if not ok]
        pairs += len(wins) * len(losses)
        violations += sum(lo > w + EPS for w in wins for lo in losses)
    return {"dead_group_ratio": dead / len(groups) if groups else 0.0,
            "ordering_violations": violations / pairs if pairs else 0.0, "groups": len(groups), "pairs": pairs}


def demo(n_groups: int = 400, size: int = 4, seed: int = 0) -> list:
    rng = random.Random(seed)
    groups = []
    for _ in range(n_groups):
        p = rng.choice([0.0, 0.0, 0.1, 0.3, 0.6, 0.9])  # many hard tasks: most groups all-fail
        group = []
        for _ in range(size):
            ok = rng.random() < p
            labels = [1.0 if rng.random() < (0.75 if ok else 0.4) else -1.0 for _ in range(rng.randint(2, 6))]
            group.append((ok, float(ok), labels))
        groups.append(group)
    return groups


def from_store(workdir: str, run: str | None) -> list:
    from evotrainer.store import Store

    by_group = defaultdict(list)
    with Store.open(workdir) as store:
        run_id = store.run_id(run) if run else None
        for sr in store.iter_rollouts(run_id=run_id):
            r = sr.rollout
            reward = sr.reward if sr.reward is not None else float(r.outcome.success)
            by_group[r.group_id].append((r.outcome.success, reward, label_values(r.meta.get("step_labels"))))
    return [g for g in by_group.values() if len(g) > 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir")
    ap.add_argument("--run")
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.5])
    args = ap.parse_args()
    if not args.demo and not args.workdir:
        ap.error("give --workdir (stored rollouts with step labels) or --demo")
    groups = demo(seed=args.seed) if args.demo else from_store(args.workdir, args.run)
    labelled = sum(labels is not None for g in groups for _, _, labels in g)
    print(f"{len(groups)} groups, {sum(map(len, groups))} rollouts, {labelled} with step labels")
    print(f"{'signal':<22} {'dead_group_ratio':>17} {'ordering_violations':>20}")
    rows = [("outcome only (GRPO)", None)] + [(f"step credit a={a:g}", a) for a in args.alphas]
    for name, alpha in rows:
        m = metrics(groups, alpha)
        print(f"{name:<22} {m['dead_group_ratio']:>17.4f} {m['ordering_violations']:>20.4f}")


if __name__ == "__main__":
    main()
