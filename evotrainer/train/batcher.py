"""One batched `generate` per turn for episodes that run in their own threads (the agent scaffold's
batched rollouts, train/rollout.py).

`Batcher.run(jobs)` starts each job (one episode) in a thread and serves, from the calling thread,
the `generate(ids, max_new)` requests the jobs make: once every job still running waits for a
reply, their requests go to the model as one left-padded batch. Tool calls and test runs of the
episodes happen in their threads between requests, so they overlap one another, and the model runs
only in the calling thread (inside the caller's generation context and under no_grad). `call(fn)`
runs other work in the calling thread too (the harness's `stop`, whose sandbox worker must outlive
the episode's thread).

Each episode keeps its own KV cache across turns. A request brings the episode's whole trace and
the cache of a prefix of it; the batch's rows are left-padded to one width, and the columns every
row has cached (all but the longest uncached tail) are handed to `generate` as one cache, each
row's own keys and values right-aligned under pad columns the attention mask hides. So a turn
prefills only the text since each episode's last reply (at worst, in a short row, a few tokens it
had cached). Position ids come from the attention mask, counting the row's real tokens, which is
how the cached keys were computed in the first place. After the batch, each row's cache is cut back
to its own trace (its prompt and reply, without the pad columns of other rows or the pad tokens
after its end) and returned with the reply.

A step's episodes of one task start from the same prompt: requests with no cache yet and the same
ids get the KV of all but their last token from one single-row pass (`_share_prompts`), so a
group's prompt is prefilled once, not once per episode.

Simplifications: a turn's batch waits for every live episode, so one slow tool call holds the
batch (a batch that left it out would split into ever smaller batches as episodes drift apart).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class BatchAborted(RuntimeError):
    """Raised into an episode's request after another episode or the model failed."""


Kv = list[tuple[Any, Any]]  # one row's KV cache: each layer's (keys, values), [1, heads, tokens, dim]


@dataclass
class _Request:
    ids: list[int] = field(default_factory=list)  # a generate request: the trace so far
    max_new: int = 0
    cache: Kv | None = None  # the KV of a prefix of `ids`
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

    def generate(self, ids: Sequence[int], max_new: int, sizes: list[int] | None = None,
                 cache: Kv | None = None) -> tuple[list[int], Kv | None]:
        """The new ids after `ids` (at most `max_new`, up to and including the end token) and the KV
        cache of `ids` and the reply, as far as the model computed it (for the next request); blocks
        until the batch this request joins has run. `cache`: the last reply's, or None. `sizes` gets
        that batch's size."""
        request = self._submit(_Request(list(ids), max_new, cache), self._waiting)
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

    def _forward(self, batch: Sequence[_Request]) -> list[tuple[list[int], Kv | None]]:
        import torch

        self.sizes.append(len(batch))
        self._share_prompts(batch)
        width = max(len(r.ids) for r in batch)
        # every row feeds at least its last token; the columns left of the longest uncached tail are cached
        fresh = max(len(r.ids) - min(_length(r.cache), len(r.ids) - 1) for r in batch)
        past = width - fresh
        device = self.model.device
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(batch):  # left padding: every row's last token is at the end
            ids[row, width - len(r.ids):] = torch.tensor(r.ids, dtype=torch.long, device=device)
            mask[row, width - len(r.ids):] = 1
        kwargs: dict[str, Any] = {"max_new_tokens": max(r.max_new for r in batch), "pad_token_id": self.pad_token_id,
                                  "return_dict_in_generate": True}
        if past > 0:
            kwargs[cache_kwarg()] = _join([r.cache for r in batch], [len(r.ids) - fresh for r in batch], past)
        if self.generation_config is None:
            kwargs["do_sample"] = False
        else:
            kwargs["generation_config"] = self.generation_config
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        sequences = out.sequences
        # transformers 5 names it `cache` (4.x: past_key_values)
        cache = out.get("cache", out.get("past_key_values"))
        cached = _length(cache) if cache is not None else 0
        stop = self._stop_ids()
        replies = []
        for i, (row, r) in enumerate(zip(sequences[:, width:].tolist(), batch)):
            row = row[:r.max_new]
            # a row that ended before the longest one is filled with pad ids after its end token
            end = next((j + 1 for j, t in enumerate(row) if t in stop), len(row))
            reply = row[:end]
            # the row's own columns: its trace and the reply tokens the model fed back (not the last)
            keep = None if cache is None else _row(cache, i, width - len(r.ids), width + min(len(reply), cached - width))
            replies.append((reply, keep))
        return replies

    def _share_prompts(self, batch: Sequence[_Request]) -> None:
        """Requests with no cache and the same ids get the KV of all but their last token, computed
        once for them all (the last token is fed by `generate`, which needs a fresh column a row)."""
        import torch

        groups: dict[tuple[int, ...], list[_Request]] = {}
        for r in batch:
            if r.cache is None and len(r.ids) > 1:
                groups.setdefault(tuple(r.ids), []).append(r)
        for ids, group in groups.items():
            if len(group) < 2:
                continue
            with torch.no_grad():
                out = self.model(input_ids=torch.tensor([ids[:-1]], device=self.model.device), use_cache=True,
                                 logits_to_keep=1)
            cache = _row(out.get("cache", out.get("past_key_values")), 0, 0, len(ids) - 1)
            for r in group:
                r.cache = cache  # read only: _join copies it into the batch's tensors


def cache_kwarg() -> str:
    """`generate`'s name for a cache to continue from: `cache` in transformers 5 (where
    `past_key_values` is a deprecated alias), `past_key_values` in 4.x."""
    import transformers

    return "cache" if int(transformers.__version__.split(".")[0]) >= 5 else "past_key_values"


def _length(cache) -> int:
    """The number of tokens a cache (a row's Kv or a transformers Cache) holds."""
    if cache is None:
        return 0
    if isinstance(cache, list):
        return int(cache[0][0].shape[2]) if cache else 0
    return int(cache.get_seq_length())


def _join(caches: Sequence[Kv | None], lengths: Sequence[int], past: int):
    """One DynamicCache of `past` columns: row i's first `lengths[i]` cached tokens right-aligned
    (the columns of its trace left of the uncached tail), zeros under the pad columns."""
    from transformers import DynamicCache

    template = next(c for c in caches if c)
    layers = []
    for layer, (k0, v0) in enumerate(template):
        keys = k0.new_zeros((len(caches), k0.shape[1], past, k0.shape[3]))
        values = v0.new_zeros((len(caches), v0.shape[1], past, v0.shape[3]))
        for row, (cache, n) in enumerate(zip(caches, lengths)):
            if cache and n > 0:
                keys[row, :, past - n:] = cache[layer][0][0, :, :n]
                values[row, :, past - n:] = cache[layer][1][0, :, :n]
        layers.append((keys, values))
    return DynamicCache(layers)


def _row(cache, row: int, start: int, end: int) -> Kv | None:
    """Columns [start, end) of one row of a DynamicCache, copied out of the batch's tensors."""
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(layer, "keys", None) is None for layer in layers):
        return None  # another cache kind (static, offloaded, ...): the next turn prefills again
    return [(layer.keys[row:row + 1, :, start:end].clone(), layer.values[row:row + 1, :, start:end].clone())
            for layer in layers]


__all__ = ["BatchAborted", "Batcher", "cache_kwarg"]
