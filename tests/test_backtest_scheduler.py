"""The backtest's side scheduler (evotrainer/backtest/scheduler.py) on its own: real threads and
queues, sides that are plain functions instead of sandbox pools. The replay built on it is
tests/test_backtest.py's (same rollouts, same numbers, replayed)."""

from __future__ import annotations

import threading
import time

import pytest

from evotrainer.backtest.scheduler import SideScheduler
from evotrainer.harness.sandbox import CandidateFailure


def echo(scale: int, delay: float = 0.0):
    """A side that answers each message with (its position, message * scale)."""
    def serve(messages, emit):
        emit("ready", None)
        for i, m in enumerate(messages):
            time.sleep(delay)
            emit("reply", (i, m * scale))
        emit("cpu", scale)
    return serve


def run(serves, items, capacity=2):
    events = []
    with SideScheduler(serves, capacity, lambda kind, label, payload: events.append((kind, label, payload))) as s:
        for item in items:
            for label in serves:
                s.send(label, item)
            s.poll()
        s.finish()
    return events, s


def of(events, label):
    return [(kind, payload) for kind, name, payload in events if name == label]


def test_each_side_sees_its_messages_and_its_events_arrive_in_order():
    events, sched = run({"base": echo(1), "candidate": echo(10, delay=0.002)}, range(20))
    assert of(events, "base") == [("ready", None), *[("reply", (i, i)) for i in range(20)], ("cpu", 1)]
    assert of(events, "candidate") == [("ready", None), *[("reply", (i, 10 * i)) for i in range(20)], ("cpu", 10)]
    assert not any(t.is_alive() for t in sched.threads)


def test_a_slow_side_holds_at_most_its_queue_and_the_fast_one_is_not_blocked_by_it():
    """The bounded queue is what bounds the chunks in memory: sending waits, handling events."""
    release = threading.Event()
    seen = []

    def slow(messages, emit):
        release.wait(10)
        for m in messages:
            emit("reply", m)

    def handle(kind, label, payload):
        seen.append((label, payload))
        if label == "fast" and payload == (9, 9):
            release.set()  # the fast side got everything while the slow one held only its queue

    with SideScheduler({"fast": echo(1), "slow": slow}, 3, handle) as s:
        for m in range(10):
            s.send("fast", m)
        assert s.queues["slow"].qsize() == 0
        for m in range(10):
            if m == 3:  # the slow side has pulled nothing: this send waits, handling the fast side's replies
                assert not release.is_set() and s.queues["slow"].full()
            s.send("slow", m)
        s.finish()
    assert [p for label, p in seen if label == "slow"] == list(range(10))


def test_a_failing_side_raises_its_error_and_every_thread_ends():
    def broken(messages, emit):
        for i, m in enumerate(messages):
            if i == 2:
                raise CandidateFailure("boom in its reward", "candidate")
            emit("reply", (i, m))

    handled = []
    with pytest.raises(CandidateFailure) as err:
        with SideScheduler({"base": echo(1, delay=0.01), "candidate": broken}, 2,
                           lambda *e: handled.append(e)) as sched:
            for m in range(50):
                sched.send("base", m)
                sched.send("candidate", m)
                sched.poll()
            sched.finish()
    assert err.value.harness == "candidate" and "boom" in str(err.value)
    assert not any(t.is_alive() for t in sched.threads), "the other side was stopped and joined, not left running"
    assert [p for kind, label, p in handled if label == "candidate" and kind == "reply"] == [(0, 0), (1, 1)]
    # the next replay (the next candidate's backtest) is untouched by the failure
    events, _ = run({"base": echo(1), "candidate": echo(2)}, range(5))
    assert [p for k, p in of(events, "candidate") if k == "reply"] == [(i, 2 * i) for i in range(5)]


def test_an_error_in_handling_cancels_the_sides_and_drops_what_is_queued():
    """The calling thread's own failure (a reply that fails its check, a time budget) stops
    everything: queued messages are never served and each side's thread is joined."""
    served = []

    def counting(messages, emit):
        for m in messages:
            time.sleep(0.01)
            served.append(m)
            emit("reply", m)

    def handle(kind, label, payload):
        if payload == 1:
            raise CandidateFailure("ran past its time budget", label)

    with pytest.raises(CandidateFailure, match="time budget"):
        with SideScheduler({"candidate": counting}, 8, handle) as sched:
            for m in range(8):
                sched.send("candidate", m)
            sched.finish()
    assert not any(t.is_alive() for t in sched.threads)
    assert len(served) < 8, "messages queued after the failure were still replayed"


def test_leaving_the_block_early_cancels_a_side_blocked_on_a_full_queue():
    """Cancellation while a side is still busy and its queue full: stop() waits only for it to
    pull, then tells it to end; nothing hangs."""
    gate = threading.Event()

    def stuck(messages, emit):
        for m in messages:
            gate.wait(0.2)
            emit("reply", m)

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with SideScheduler({"candidate": stuck}, 1, lambda *e: None) as sched:
            sched.send("candidate", 0)
            sched.send("candidate", 1)
            raise KeyboardInterrupt
    assert not any(t.is_alive() for t in sched.threads) and time.monotonic() - started < 5


def test_a_side_that_ends_early_takes_no_more_messages():
    """A side whose serve returns before its messages end (a pool that stopped) is closed: sends
    to it return at once instead of filling a queue nobody reads."""
    def one(messages, emit):
        emit("reply", next(iter(messages)))

    with SideScheduler({"candidate": one}, 1, lambda *e: None) as sched:
        started = time.monotonic()
        for m in range(20):
            sched.send("candidate", m)
        sched.finish()
    assert not sched.open["candidate"] and time.monotonic() - started < 5
