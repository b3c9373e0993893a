"""Replay harness versions side by side: the parent reads each chunk once and feeds every side's own pool.

Each side (base, candidate) gets a pool of fresh worker processes that load only its harness;
a thread per side hands the pool its messages from a bounded queue and passes the replies back
(scheduler.py). Everything that decides stays in the calling thread: it reads the rows, keeps the
verified facts of the chunks in flight, checks each reply and adds it to that side's tally
(`_Scoring`, with scoring.py).
Measured time is the CPU time of the side's worker processes, read here from /proc.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from evotrainer.backtest.metrics import Tally
from evotrainer.backtest.replay_worker import ReplayJob
from evotrainer.backtest.rows import ChunkReader, Fact
from evotrainer.backtest.scheduler import Emit, SideScheduler
from evotrainer.backtest.scoring import Fingerprint, Side, add_values, check_values, check_weights, task_shares
from evotrainer.backtest.selector import Selection
from evotrainer.config import GateConfig
from evotrainer.harness.sandbox import CandidateFailure, SandboxLimits
from evotrainer.store import Store

_FEED = 4  # messages queued per side beyond what its workers hold: bounds the chunks in memory
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class SideRun:
    """One harness version's replay: what the parent computed from its workers' raw values."""

    side: Side
    sources: Mapping[str, str]
    tally: Tally = field(default_factory=Tally)
    fingerprint: Fingerprint = field(default_factory=Fingerprint)
    shares: dict[str, float] | None = None  # its curriculum's task shares, with a task history
    seconds: float = 0.0  # CPU seconds of its worker processes
    startup: float = 0.0  # starting its pool: fresh workers loading the harness


def _serve(pool_class: Callable[..., Any], run: SideRun, job: ReplayJob, workers: int, limits: SandboxLimits,
           messages: Iterator[Any], emit: Emit) -> None:
    """A side's thread: its pool replays the messages; each reply goes back with the CPU time so far."""
    with pool_class([(run.side.label, dict(run.sources))], job, workers, limits) as pool:
        since = time.perf_counter()
        emit("ready", since)
        for index, reply in pool.imap(messages):
            emit("reply", (index, reply, _cpu_seconds(pool, since)))
        emit("cpu", _cpu_seconds(pool, since))  # before the workers exit


def _tree_ticks(pid: int) -> int:
    """utime + stime of a process and all its descendants (a sandboxed worker runs as a child
    of its launcher), in clock ticks; 0 for a process that is gone."""
    ticks, todo = 0, [pid]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, IndexError, ValueError):
            pass
    return ticks


def _cpu_seconds(pool: Any, since: float) -> float:
    """CPU time of the pool's worker processes; wall time times workers where they are not ours
    to read (the Ray executor's workers live in actors)."""
    workers = getattr(pool, "workers", None)
    if workers is None:
        return (time.perf_counter() - since) * pool.size
    return sum(_tree_ticks(w.process.pid) for w in workers if w.process.pid is not None) / _TICK


def replay(store: Store, selection: Selection, runs: list[SideRun], chunks: Iterable[tuple], gate: GateConfig,
           pool_class: Callable[..., Any], workers: int, hist: tuple | None, *,
           base_shares: dict[str, float] | None = None, on_rollouts: Callable[[str, int], None] | None = None,
           budget: str | None = "candidate") -> None:
    """Score every side over the chunks, filling each SideRun; CandidateFailure names the side
    that failed. `base_shares`: the base's task shares when the base is not among `runs`."""
    limits = SandboxLimits(call_timeout_s=gate.call_timeout_s, load_timeout_s=gate.load_timeout_s,
                           message_timeout_s=gate.time_budget_s)
    job = ReplayJob(gate.determinism_sample)
    # The sides run at once, so they share the workers asked for: as many processes as one side
    # had before, and on Ray no more actors than the cluster has CPUs (more would never start).
    per_side = max(1, workers // len(runs))
    scoring = _Scoring(runs, hist, gate, selection.count, base_shares=base_shares, on_rollouts=on_rollouts,
                       budget=budget)
    serves = {r.side.label: partial(_serve, pool_class, r, job, per_side, limits) for r in runs}
    reader = ChunkReader(store, selection.scope)
    with SideScheduler(serves, 2 * per_side + _FEED, scoring.handle, name="evotrainer-backtest") as sides:
        if hist:
            for label in serves:
                sides.send(label, ("weights", hist))
        for number, chunk in enumerate(chunks):
            frozen, facts = reader.read(chunk)
            scoring.expect(number, facts)
            for label in serves:
                sides.send(label, ("groups", frozen))
            sides.poll()
        sides.finish()


class _Scoring:
    """The calling thread's side of a replay: the facts of the chunks in flight, each reply checked
    and added to its side's tally. With a task history, each side's message 0 asks for its
    curriculum weights, and its replies wait until both its own and the base's shares are known."""

    def __init__(self, runs: list[SideRun], hist: tuple | None, gate: GateConfig, count: int, *,
                 base_shares: dict[str, float] | None, on_rollouts: Callable[[str, int], None] | None,
                 budget: str | None):
        self.by_label = {r.side.label: r for r in runs}
        self.hist, self.gate, self.count = hist, gate, count
        self.base_shares, self.on_rollouts, self.budget = base_shares, on_rollouts, budget
        self.offset = 1 if hist else 0
        self.pending: dict[int, list] = {}  # chunk number -> [its facts, sides still to answer]
        self.waiting: dict[str, list] = {label: [] for label in self.by_label}  # replies held until shares are known
        self.start = time.perf_counter()

    def expect(self, number: int, facts: list[list[Fact]]) -> None:
        self.pending[number] = [facts, len(self.by_label)]

    def base(self) -> dict[str, float] | None:
        return self.base_shares if "base" not in self.by_label else self.by_label["base"].shares

    def weight_of(self, run: SideRun) -> Callable[[str], float | None]:
        drawn_shares, own = self.base(), run.shares
        assert drawn_shares is not None and own is not None  # score() waits until both are known

        def weight(task: str) -> float | None:  # p(task) under this harness over p(task) under the base
            drawn = drawn_shares.get(task, 0.0)
            return own.get(task, 0.0) / drawn if drawn > 0 else None
        return weight

    def score(self, label: str, number: int, reply: Any) -> None:
        run = self.by_label[label]
        facts: list[list[Fact]] = self.pending[number][0]
        values = check_values(label, reply, facts)
        add_values(run.tally, run.side, facts, values, self.weight_of(run) if self.hist else None)
        run.fingerprint.add_values(facts, values)
        self.pending[number][1] -= 1
        if not self.pending[number][1]:
            del self.pending[number]
        if self.on_rollouts:
            self.on_rollouts(label, sum(map(len, facts)))

    def handle(self, kind: str, label: str, payload: Any) -> None:
        run = self.by_label[label]
        if kind == "ready":
            run.startup = payload - self.start
            return
        if kind == "cpu":
            run.seconds = max(run.seconds, payload)
            return
        index, reply, cpu = payload
        if self.hist and index == 0:
            weights = check_weights(label, reply, [row[0] for row in self.hist])
            run.fingerprint.add(["weights", list(weights.items())])
            run.shares = task_shares(weights)
        else:
            self.waiting[label].append((index - self.offset, reply))
        for name, held in self.waiting.items():  # score what can be scored now
            if held and (not self.hist or (self.by_label[name].shares is not None and self.base() is not None)):
                for number, value in held:
                    self.score(name, number, value)
                held.clear()
        run.seconds = max(run.seconds, cpu)  # CPU time only grows; a worker that exited reads 0
        if label == self.budget and run.seconds > self.gate.time_budget_s:
            raise CandidateFailure(f"ran past its time budget of {self.gate.time_budget_s:g} s after "
                                   f"{run.tally.rollouts} of {self.count} rollouts", label)


__all__ = ["SideRun", "replay"]
