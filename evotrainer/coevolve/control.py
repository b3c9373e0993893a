"""Verification's control arm: the round after a promotion, trained a second time without it.

Comparing round k+1 (under the promoted change) with round k charges the policy's own drift
between rounds to the change: the same change was reverted in one seed and validated in another,
each time matching what a run with no change at all did in that round. The control arm removes
that: before round k+1 trains, a control run (`<run>~control`, in the same store) trains its
round k+1 from the main run's round-k adapter, with the same seed, the same task history
(the main run's rounds before k+1) and the same steps, under the harness main had before the
promotion (the merge commit's first parent). The change is then the only difference between the
two arms, and both answer the same validation tasks (held-out ones without a validation
split), so stage verify compares them task by task
(coevolve/verify.py:verify_paired). It costs one more training round per promotion verified.
When the change is reverted, the next round continues from the control arm's adapter, so the
revert undoes the change's training as well as its code.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.console import Console

from evotrainer.coevolve.beside import SideArm
from evotrainer.coevolve.state import Pending, RunStateError
from evotrainer.config import Config

SUFFIX = "~control"


def control_run(run_name: str) -> str:
    return f"{run_name}{SUFFIX}"


def control_arm(config: Config, pending: Pending, index: int) -> SideArm:
    """The control arm of round `index`: from the promotion round's adapter, under main as it was
    before the promotion (the merge commit's first parent); trained by coevolve/beside.py."""
    return SideArm(control_run(config.run_name), f"{pending.merge}^1", pending.round, index,
                   f"control arm (main before {pending.branch})", heldout=None)


def train_arm(config: Config, root: Path, run_name: str, harness, start_round: int | None, index: int,
              console: Console, *, what: str, steps: int | None = None, heldout: bool | None = True,
              copy_memory: bool = True) -> bool:
    """Round `index` of run `run_name` under `harness`, trained from the main run's round
    `start_round` adapter with the main run's seed and task history before `index` (from the base
    model, with no history, when `start_round` is None), unless that round is already done; True
    if it trained. The control arm and the live pilot's arms. `heldout`: evaluate the held-out
    split too (None: only where it is what verify decides on, the run having no validation split).
    `copy_memory` False: the caller already gave it the main run's replay memory (copy_memory_file)."""
    from evotrainer.train.loop import open_session, train_from

    arm = config.model_copy(update={"run_name": run_name})
    session = open_session(arm, root, console, harness=harness)
    session.eval_heldout = heldout if heldout is not None else not session.validation
    try:
        if _finished_round(session.store, session.run_id, index) is not None:
            return False
        start = None
        if start_round is not None:
            main = session.store.run_id(config.run_name)
            start = _round_adapter(session.store, main, start_round)
            if start is None:
                raise RunStateError(f"{what}: run {config.run_name!r} has no finished round {start_round}")
            session.stats_run_id, session.stats_before = main, index
            if copy_memory:
                copy_memory_file(root, config.run_name, run_name)
        origin = "the base model" if start is None else f"round {start_round}'s adapter"
        console.print(f"{what}: round {index} from {origin} under {harness.version[:8]}")
        summary = train_from(session, start, index, steps)
        console.print(f"{what}: {describe_scores(summary.heldout_success, summary.validation_success)}")
        return True
    finally:
        session.store.close()


def copy_memory_file(root: Path, main: str, arm: str) -> None:
    """Start arm run `arm` from the main run's replay memory (harness.yaml memory, when on)."""
    memory = root / "memory" / f"{main}.json"
    if memory.is_file():
        shutil.copyfile(memory, root / "memory" / f"{arm}.json")


def arm_done(root: Path, config: Config, run_name: str, index: int) -> bool:
    """Whether run `run_name` has finished round `index`."""
    from evotrainer.store import Store

    with Store.open(root, config.store.url) as store:
        return _finished_round(store, store.run_id(run_name), index) is not None


def control_adapter(root: Path, config: Config, index: int) -> str | None:
    """The adapter the control arm's round `index` saved (None if it has not finished)."""
    from evotrainer.store import Store

    with Store.open(root, config.store.url) as store:
        return _round_adapter(store, store.run_id(control_run(config.run_name)), index)


def describe_scores(heldout: float | None, validation: float | None) -> str:
    """'held-out success 0.250, validation success 0.300' (what an arm's round measured)."""
    scores = [f"{name} success {value:.3f}" for name, value in (("held-out", heldout), ("validation", validation))
              if value is not None]
    return ", ".join(scores) or "no evals"


def _finished_round(store, run_id: int | None, index: int) -> dict | None:
    """A run's round `index` if it has finished, else None."""
    rounds = store.rounds(run_id) if run_id is not None else []
    return next((r for r in rounds if r["index"] == index and r["finished_at"]), None)


def _round_adapter(store, run_id: int | None, index: int) -> str | None:
    """The adapter a run's finished round `index` saved, or None."""
    rnd = _finished_round(store, run_id, index)
    return rnd["adapter_path"] if rnd else None


def control_evals(store, run_name: str, index: int, split: str) -> list[dict]:
    """The control arm's evals on `split` of round `index` (empty when it has none)."""
    run_id = store.run_id(control_run(run_name))
    if run_id is None:
        return []
    return [e for e in store.evals(run_id) if e["split"] == split and e["adapter"] and e["round_index"] == index]
