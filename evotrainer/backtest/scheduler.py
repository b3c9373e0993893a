"""One thread per side, fed from the calling thread: the plumbing of a side-by-side replay.

A backtest replays the same chunks under several harness versions at once (passes.py). Each
side's work runs in a thread of its own (`serve`: it pulls the side's messages and emits events),
while everything that decides stays in the calling thread: it sends each side its messages through
a bounded queue, and every event the sides emit is handed to `handle` there, in the order each
side emitted it. Kept apart from the scoring so that ordering, failure and cancellation can be
tested without a sandbox (tests/test_backtest_scheduler.py).

    with SideScheduler(serves, capacity, handle) as sched:
        for item in work:
            sched.send(label, item)   # blocks while the side's queue is full, handling events
            sched.poll()              # handle what has arrived, without waiting
        sched.finish()                # every side told to end; waits until each has ended

A side whose `serve` raises emits ("error", exc): `handle` never sees it, the exception is raised
in the calling thread from the next send/poll/finish. Leaving the `with` block for any reason
stops every side: queued messages are dropped, each side is told to end, every thread is joined.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

END = object()  # the last message a side's serve sees: its message iterator stops there
_POLL_S = 0.05

Emit = Callable[[str, Any], None]
Serve = Callable[[Iterator[Any], Emit], None]  # (the side's messages, emit(kind, payload)); runs in its thread
Handle = Callable[[str, str, Any], None]  # (kind, label, payload); runs in the calling thread


class SideScheduler:
    """Threads serving sides by label; see the module docstring for the protocol."""

    def __init__(self, serves: Mapping[str, Serve], capacity: int, handle: Handle, *, name: str = "evotrainer-side"):
        self.handle = handle
        self.queues: dict[str, queue.Queue] = {label: queue.Queue(maxsize=capacity) for label in serves}
        self.open = {label: True for label in serves}  # False once the side's thread is done with its queue
        self.events: queue.Queue = queue.Queue()
        self.threads = [threading.Thread(target=self._run, args=(label, serve), name=f"{name}-{label}", daemon=True)
                        for label, serve in serves.items()]

    def __enter__(self) -> SideScheduler:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- the sides' threads

    def _run(self, label: str, serve: Serve) -> None:
        def emit(kind: str, payload: Any) -> None:
            self.events.put((kind, label, payload))

        try:
            serve(self._messages(label), emit)
        except BaseException as exc:
            emit("error", exc)
        emit("end", None)

    def _messages(self, label: str) -> Iterator[Any]:
        while (item := self.queues[label].get()) is not END:
            yield item

    # ---------------------------------------------------------------- the calling thread

    def send(self, label: str, item: Any) -> None:
        """Queue one message for a side, handling events while its queue is full; a side that has
        already ended takes nothing (its failure, if any, is raised by the handling)."""
        while self.open[label]:
            try:
                self.queues[label].put(item, timeout=_POLL_S)
                return
            except queue.Full:
                self.poll()

    def poll(self, wait: bool = False) -> None:
        """Handle every event that has arrived; with `wait`, first wait a moment for one."""
        try:
            while True:
                kind, label, payload = self.events.get(timeout=_POLL_S) if wait else self.events.get_nowait()
                wait = False
                self._dispatch(kind, label, payload)
        except queue.Empty:
            pass

    def finish(self) -> None:
        """Tell every side its messages are done and handle events until each has ended."""
        for label in self.queues:
            self.send(label, END)
        while any(self.open.values()):
            self.poll(wait=True)

    def stop(self) -> None:
        """Cancel: drop what is still queued (it would be served in vain), tell each side to end
        without handling its events any more, and join every thread."""
        for label, q in self.queues.items():
            try:
                while True:
                    q.get_nowait()
            except queue.Empty:
                pass
            while self.open[label]:
                try:
                    q.put(END, timeout=_POLL_S)
                    break
                except queue.Full:  # only wait for the side to pull: its events no longer count
                    try:
                        kind, name, _ = self.events.get_nowait()
                        if kind == "end":
                            self.open[name] = False
                    except queue.Empty:
                        pass
        for thread in self.threads:
            if thread.ident is not None:
                thread.join()

    def _dispatch(self, kind: str, label: str, payload: Any) -> None:
        if kind == "error":
            raise payload
        if kind == "end":
            self.open[label] = False
            return
        self.handle(kind, label, payload)


__all__ = ["END", "Emit", "Handle", "Serve", "SideScheduler"]
