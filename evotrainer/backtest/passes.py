"""Replay harness versions side by side: the parent reads each chunk once and feeds every side's own pool.

Each side (base, candidate) gets a pool of fresh worker processes that load only its harness;
a thread per side hands the pool its messages from a bounded queue and passes the replies back.
Everything that decides stays in the calling thread: it reads the rows, keeps the verified facts
of the chunks in flight, checks each reply and adds it to that side's tally (scoring.py).
Measured time is the CPU time of the side's worker processes, read here from /proc.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evotrainer.backtest.metrics import Tally
from evotrainer.backtest.replay_worker import ReplayJob
from evotrainer.backtest.rows import ChunkReader, Fact
from evotrainer.backtest.scoring import Fingerprint, Side, add_values, check_values, check_weights, task_shares
from evotrainer.backtest.selector import Selection
from evotrainer.config import GateConfig
from evotrainer.harness.sandbox import CandidateFailure, SandboxLimits
from evotrainer.store import Store

_END = object()
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


class _Feed:
    """A side's messages, as its pool's imap pulls them (in the side's thread)."""

    def __init__(self, workers: int):
        self.queue: queue.Queue = queue.Queue(maxsize=2 * workers + _FEED)
        self.open = True  # False once the side's thread is done: nobody pulls any more

    def __iter__(self):
        while (item := self.queue.get()) is not _END:
            yield item


def _serve(pool_class: Callable[..., Any], run: SideRun, job: ReplayJob, workers: int, limits: SandboxLimits,
           feed: _Feed, results: queue.Queue) -> None:
    label = run.side.label
    try:
        with pool_class([(label, dict(run.sources))], job, workers, limits) as pool:
            since = time.perf_counter()
            results.put(("ready", label, since))
            for index, reply in pool.imap(feed):
                results.put(("reply", label, (index, reply, _cpu_seconds(pool, since))))
            results.put(("cpu", label, _cpu_seconds(pool, since)))  # before the workers exit
    except BaseException as exc:
        results.put(("error", label, exc))
    results.put(("end", label, None))


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
    by_label = {r.side.label: r for r in runs}
    limits = SandboxLimits(call_timeout_s=gate.call_timeout_s, load_timeout_s=gate.load_timeout_s,
                           message_timeout_s=gate.time_budget_s)
    job = ReplayJob(gate.determinism_sample)
    results: queue.Queue = queue.Queue()
    # The sides run at once, so they share the workers asked for: as many processes as one side
    # had before, and on Ray no more actors than the cluster has CPUs (more would never start).
    per_side = max(1, workers // len(runs))
    feeds = {label: _Feed(per_side) for label in by_label}
    start = time.perf_counter()
    threads = [threading.Thread(target=_serve, args=(pool_class, r, job, per_side, limits, feeds[r.side.label], results),
                                name=f"evotrainer-backtest-{r.side.label}", daemon=True) for r in runs]
    pending: dict[int, list] = {}  # chunk number -> [its facts, sides still to answer]
    waiting: dict[str, list] = {label: [] for label in by_label}  # replies held until shares are known
    offset = 1 if hist else 0  # with a history, each side's message 0 asks for its weights
    failure: BaseException | None = None

    def base() -> dict[str, float] | None:
        return base_shares if "base" not in by_label else by_label["base"].shares

    def weight_of(run: SideRun) -> Callable[[str], float | None]:
        drawn_shares, own = base(), run.shares
        assert drawn_shares is not None and own is not None  # score() waits until both are known

        def weight(task: str) -> float | None:  # p(task) under this harness over p(task) under the base
            drawn = drawn_shares.get(task, 0.0)
            return own.get(task, 0.0) / drawn if drawn > 0 else None
        return weight

    def score(label: str, number: int, reply: Any) -> None:
        run = by_label[label]
        facts: list[list[Fact]] = pending[number][0]
        values = check_values(label, reply, facts)
        add_values(run.tally, run.side, facts, values, weight_of(run) if hist else None)
        run.fingerprint.add_values(facts, values)
        pending[number][1] -= 1
        if not pending[number][1]:
            del pending[number]
        if on_rollouts:
            on_rollouts(label, sum(map(len, facts)))

    def handle(kind: str, label: str, payload: Any) -> None:
        run = by_label[label]
        if kind == "error":
            raise payload
        if kind == "end":
            feeds[label].open = False
            return
        if kind == "ready":
            run.startup = payload - start
            return
        if kind == "cpu":
            run.seconds = max(run.seconds, payload)
            return
        index, reply, cpu = payload
        if hist and index == 0:
            weights = check_weights(label, reply, [row[0] for row in hist])
            run.fingerprint.add(["weights", list(weights.items())])
            run.shares = task_shares(weights)
        else:
            waiting[label].append((index - offset, reply))
        for name, held in waiting.items():  # score what can be scored now
            if held and (not hist or (by_label[name].shares is not None and base() is not None)):
                for number, value in held:
                    score(name, number, value)
                held.clear()
        run.seconds = max(run.seconds, cpu)  # CPU time only grows; a worker that exited reads 0
        if label == budget and run.seconds > gate.time_budget_s:
            raise CandidateFailure(f"ran past its time budget of {gate.time_budget_s:g} s after "
                                   f"{run.tally.rollouts} of {selection.count} rollouts", label)

    def drain(block: bool) -> None:
        try:
            while True:
                kind, label, payload = results.get(timeout=0.05) if block else results.get_nowait()
                block = False
                handle(kind, label, payload)
        except queue.Empty:
            pass

    def put(label: str, item: Any, *, stopping: bool = False) -> None:
        while feeds[label].open:
            try:
                feeds[label].queue.put(item, timeout=0.05)
                return
            except queue.Full:
                if stopping:  # only wait for the side to pull: its results no longer count
                    try:
                        kind, name, _ = results.get_nowait()
                        if kind == "end":
                            feeds[name].open = False
                    except queue.Empty:
                        pass
                else:
                    drain(False)

    for thread in threads:
        thread.start()
    reader = ChunkReader(store, selection.scope)
    try:
        if hist:
            for label in by_label:
                put(label, ("weights", hist))
        for number, chunk in enumerate(chunks):
            frozen, facts = reader.read(chunk)
            pending[number] = [facts, len(by_label)]
            for label in by_label:
                put(label, ("groups", frozen))
            drain(False)
        for label in by_label:
            put(label, _END)
        while any(f.open for f in feeds.values()):
            drain(True)
    except BaseException as exc:
        failure = exc
    finally:
        for label in by_label:
            try:  # what is still queued would only be replayed in vain
                while True:
                    feeds[label].queue.get_nowait()
            except queue.Empty:
                pass
            put(label, _END, stopping=True)
        for thread in threads:
            thread.join()
    if failure is not None:
        raise failure


__all__ = ["SideRun", "replay"]
