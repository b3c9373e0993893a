"""One batched `generate` per turn for episodes that run in their own threads (the agent scaffold's
batched rollouts, train/rollout.py).

`Batcher.run(jobs)` starts each job (one episode) in a thread and serves, from the calling thread,
the `generate(ids, max_new)` requests the jobs make: once every job still running waits for a
reply, their requests go to the model as one left-padded batch. Tool calls and test runs of the
episodes happen in their threads between requests, so they overlap one another, and the model runs
only in the calling thread (inside the caller's generation context and under no_grad). `call(fn)`
runs other work in the calling thread too (the harness's `stop`, whose sandbox worker must outlive
the episode's thread).

Simplifications: a turn's batch waits for every live episode, so one slow tool call holds the
batch (a batch that left it out would split into ever smaller batches as episodes drift apart);
each request is the whole trace so far, prefilled again every turn (no KV cache across turns).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class BatchAborted(RuntimeError):
    """Raised into an episode's request after another episode or the model failed."""


@dataclass
class _Request:
    ids: list[int] = field(default_factory=list)  # a generate request: the trace so far
    max_new: int = 0
    fn: Callable[[], Any] | None = None  # or a call to run in the batcher's thread
    done: bool = False
    out: Any = None
    error: BaseException | None = None
    size: int = 0  # of the batch it ran in


class Batcher:
    """Serves the generate requests of `run`'s jobs as batches. `generation_config` None decodes
    greedily. `sizes` records each batch's size (how far the episodes moved together)."""

    def __init__(self, model, *, pad_token_id: int, generation_config=None) -> None:
        self.model, self.pad_token_id, self.generation_config = model, pad_token_id, generation_config
        self.sizes: list[int] = []
        self._cond = threading.Condition()
        self._live = 0  # jobs not finished
        self._waiting: list[_Request] = []  # generate requests
        self._calls: list[_Request] = []
        self._failed: BaseException | None = None

    # -- the episodes' side (their threads)

    def generate(self, ids: Sequence[int], max_new: int, sizes: list[int] | None = None) -> list[int]:
        """The new ids after `ids` (at most `max_new`, up to and including the end token); blocks
        until the batch this request joins has run. `sizes` gets that batch's size."""
        request = self._submit(_Request(list(ids), max_new), self._waiting)
        if sizes is not None:
            sizes.append(request.size)
        return request.out

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) run in the batcher's thread, one call at a time. For what must not start in a
        short-lived thread: a child process started with a parent-death signal (the harness's
        sandbox worker) dies when the thread that started it ends."""
        return self._submit(_Request(fn=lambda: fn(*args)), self._calls).out

    def _submit(self, request: _Request, queue: list[_Request]) -> _Request:
        with self._cond:
            if self._failed is not None:
                raise BatchAborted("another episode of the batch failed")
            queue.append(request)
            self._cond.notify_all()
            while not request.done:
                self._cond.wait()
        if request.error is not None:
            raise request.error
        return request

    # -- the model's side (the calling thread)

    def run(self, jobs: Sequence[Callable[[], T]]) -> list[T]:
        """Each job's result, in order. The first exception any job or the model raised is raised
        here once every thread has ended (the others are aborted at their next request)."""
        results: list[Any] = [None] * len(jobs)
        with self._cond:
            self._live = len(jobs)

        def work(i: int) -> None:
            try:
                results[i] = jobs[i]()
            except BaseException as exc:  # handed to the calling thread, which raises it
                self._abort(exc)
            finally:
                with self._cond:
                    self._live -= 1
                    self._cond.notify_all()

        threads = [threading.Thread(target=work, args=(i,), name=f"episode-{i}", daemon=True)
                   for i in range(len(jobs))]
        for t in threads:
            t.start()
        try:
            while (work_ := self._next()) is not None:
                try:
                    self._serve(work_)
                except BaseException as exc:  # the model failed: so does the batch
                    self._abort(exc, work_)
                    if not isinstance(exc, Exception):
                        raise
        except BaseException as exc:  # e.g. KeyboardInterrupt while waiting: release the threads
            self._abort(exc)
            raise
        finally:
            for t in threads:
                t.join()
        if self._failed is not None:
            raise self._failed
        return results

    def _next(self) -> list[_Request] | None:
        """The calls waiting, else every live job's generate request once all are in; None when
        no job is left."""
        with self._cond:
            while not self._calls and self._live and len(self._waiting) < self._live:
                self._cond.wait()
            if self._calls:
                work, self._calls = self._calls, []
            elif self._live:
                work, self._waiting = self._waiting, []
            else:
                return None
            return work

    def _serve(self, work: list[_Request]) -> None:
        if work[0].fn is not None:
            for request in work:
                try:
                    request.out = request.fn()  # type: ignore[misc]
                except Exception as exc:  # the episode that asked decides what it means
                    request.error = exc
        else:
            for request, out in zip(work, self._forward(work)):
                request.out, request.size = out, len(work)
        with self._cond:
            for request in work:
                request.done = True
            self._cond.notify_all()

    def _abort(self, exc: BaseException, serving: Sequence[_Request] = ()) -> None:
        """Keep the first failure and fail every waiting request (and those being served), so no
        thread waits forever."""
        with self._cond:
            if self._failed is None:
                self._failed = exc
            for request in [*self._waiting, *self._calls, *serving]:
                request.error, request.done = BatchAborted(f"the batch failed: {self._failed!r}"), True
            self._waiting, self._calls = [], []
            self._cond.notify_all()

    def _stop_ids(self) -> set[int]:
        """The ids generate ends a row at (the given config's, else the model's, as generate does)."""
        eos = getattr(self.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.model.generation_config, "eos_token_id", None)
        return set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    def _forward(self, batch: Sequence[_Request]) -> list[list[int]]:
        import torch

        self.sizes.append(len(batch))
        width = max(len(r.ids) for r in batch)
        device = self.model.device
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(batch):  # left padding: every row's last token is at the end
            ids[row, width - len(r.ids):] = torch.tensor(r.ids, dtype=torch.long, device=device)
            mask[row, width - len(r.ids):] = 1
        kwargs: dict[str, Any] = {"max_new_tokens": max(r.max_new for r in batch), "pad_token_id": self.pad_token_id}
        if self.generation_config is None:
            kwargs["do_sample"] = False
        else:
            kwargs["generation_config"] = self.generation_config
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        sequences = out.sequences if hasattr(out, "sequences") else out
        stop = self._stop_ids()
        replies = []
        for row, r in zip(sequences[:, width:].tolist(), batch):
            row = row[:r.max_new]
            # a row that ended before the longest one is filled with pad ids after its end token
            end = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
            replies.append(row[:end])
        return replies


__all__ = ["BatchAborted", "Batcher"]
