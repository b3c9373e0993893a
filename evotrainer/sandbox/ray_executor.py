"""The "ray" executor: sandboxed grading jobs as Ray tasks, and backtest chunks on Ray actors.

    executor = get_executor("ray", workers=8)        # same Executor protocol as "local"
    grades = list(executor.map(grade_job, jobs))     # each job is one Ray task (1 CPU)

    with RaySandboxPool(sides, chunk_job, workers=8, limits=limits) as pool:   # SandboxPool's API
        for index, reply in pool.imap(chunks): ...

Ray only moves work between processes (and machines); the isolation is unchanged. A grading
task calls the same `run_sandboxed` (launcher, namespaces, rlimits, process-group kill) inside
its Ray worker, and a chunk actor owns an ordinary one-worker `SandboxPool`, so harness code
still runs only in an OS-sandboxed worker (harness/sandbox_launch.py) with its per-call time
budget, now started by the actor. Harness faults come back as data ("failed", label, reason) and are raised here as
CandidateFailure, exactly as the local pool raises them.

Cluster: `address` (or $RAY_ADDRESS) joins an existing one; otherwise a private single-machine
instance starts on first use (no dashboard, a fresh temp folder removed at exit).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from evotrainer.dist import usable_cpus
from evotrainer.harness.sandbox import CandidateFailure, SandboxError, SandboxLimits, SandboxPool, WorkerJob

T = TypeVar("T")
R = TypeVar("R")
_LOCK = threading.Lock()


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to Ray once per process: `address`/$RAY_ADDRESS, or a private local instance."""
    import ray

    with _LOCK:
        if ray.is_initialized():
            return
        address = address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=False)
            return
        # Ray's default /tmp/ray is shared by every session on the machine; ours is private.
        temp = tempfile.mkdtemp(prefix="evo-ray-")
        ray.init(num_cpus=num_cpus or usable_cpus(), include_dashboard=False, _temp_dir=temp,
                 log_to_driver=False)
        atexit.register(_shutdown, temp)


def _shutdown(temp: str) -> None:
    import ray

    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def cluster_cpus() -> int:
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class RayExecutor:
    """Runs fn over items as Ray tasks, at most `workers` at once; results come back in item order.

    `fn` must be importable or picklable by value (a module-level function). A task is never
    retried: a grade that killed its worker is reported, not silently run again.
    """

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        ensure_ray(address)  # a private instance gets every core: `workers` only caps concurrency
        self.workers = workers or cluster_cpus()
        self._remote: dict[Callable, Any] = {}
        self._running: dict[Any, int] = {}

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        import ray

        if fn not in self._remote:
            self._remote[fn] = ray.remote(num_cpus=1, max_retries=0)(fn)
        return self._map(self._remote[fn], items)

    def _map(self, remote: Any, items: Iterable[T]) -> Iterator[R]:
        import ray

        pending = enumerate(items)
        done: dict[int, Any] = {}
        next_out, exhausted = 0, False
        while True:
            # Keep `workers` tasks running; a slow first item must not idle the others.
            while not exhausted and len(self._running) < self.workers:
                item = next(pending, None)
                if item is None:
                    exhausted = True
                    break
                self._running[remote.remote(item[1])] = item[0]
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
            if not self._running:
                return
            ready, _ = ray.wait(list(self._running), num_returns=1)
            for ref in ready:
                index = self._running.pop(ref)
                done[index] = ray.get(ref)

    def close(self) -> None:
        import ray

        for ref in list(self._running):
            ray.cancel(ref, force=True)
        self._running.clear()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------- backtest chunks on actors


class _ChunkWorker:
    """Lives in a Ray actor: one SandboxPool worker holding both harnesses. Two threads: `run`
    (serialised by a lock) and `stop`, which only signals, so a fault elsewhere ends a long chunk."""

    def __init__(self, harnesses: Sequence[tuple[str, Mapping[str, str]]], job: WorkerJob,
                 limits: SandboxLimits) -> None:
        self.pool = SandboxPool(harnesses, job, 1, limits)
        self.lock = threading.Lock()

    def start(self) -> list:
        with self.lock:
            try:
                self.pool.__enter__()
            except CandidateFailure as failure:
                return ["failed", failure.harness, failure.reason]
            return ["ready", self.pool.versions]

    def run(self, message: Any) -> list:
        with self.lock:
            if not self.pool.workers:  # closed after a fault or a stop: never wait on nothing
                return ["failed", self.pool.harnesses[-1][0], "the chunk worker was stopped"]
            try:
                [(_, reply)] = list(self.pool.imap([message]))
            except CandidateFailure as failure:
                return ["failed", failure.harness, failure.reason]
            return ["done", reply]

    def stop(self) -> None:
        import signal

        for worker in list(self.pool.workers):
            if worker.process.pid is not None:
                try:
                    os.killpg(worker.process.pid, signal.SIGKILL)  # the worker is its own group
                except (ProcessLookupError, PermissionError):
                    pass

    def close(self) -> None:
        with self.lock:
            self.pool.close()


class RaySandboxPool:
    """SandboxPool's interface (`with`, `imap`, `versions`) over Ray actors, one per worker."""

    STARTUP_S = 300.0

    def __init__(self, harnesses: Sequence[tuple[str, Mapping[str, str]]], job: WorkerJob,
                 workers: int = 1, limits: SandboxLimits = SandboxLimits(), address: str | None = None):
        self.harnesses = tuple((label, dict(sources)) for label, sources in harnesses)
        self.job, self.limits, self.address = job, limits, address
        self.size = max(1, int(workers))
        self.actors: list[Any] = []
        self.versions: dict[str, str] = {}

    def __enter__(self) -> RaySandboxPool:
        import ray

        ensure_ray(self.address)
        # One CPU per actor: more actors than the cluster has CPUs would wait forever to start.
        self.size = min(self.size, cluster_cpus())
        actor = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0, max_concurrency=2)(_ChunkWorker)
        try:
            self.actors = [actor.remote(self.harnesses, self.job, self.limits) for _ in range(self.size)]
            for reply in self._get([a.start.remote() for a in self.actors], self.STARTUP_S):
                self._check(reply)
                self.versions = reply[1]
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def imap(self, messages: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        import ray

        pending = enumerate(messages)
        flight: dict[Any, tuple[int, int]] = {}  # ref -> (actor, message index)
        busy = [0] * len(self.actors)
        exhausted = False
        # The actor enforces every harness budget; this only bounds a stuck actor or cluster.
        wait_s = 2 * self.limits.message_timeout_s + 120
        try:
            while True:
                for i, a in enumerate(self.actors):
                    while not exhausted and busy[i] < 2:  # two in flight: the next chunk is queued
                        item = next(pending, None)
                        if item is None:
                            exhausted = True
                            break
                        flight[a.run.remote(item[1])] = (i, item[0])
                        busy[i] += 1
                if not flight:
                    return
                ready, _ = ray.wait(list(flight), num_returns=1, timeout=wait_s)
                if not ready:
                    raise SandboxError(f"no Ray chunk worker answered within {wait_s:g} s")
                for ref in ready:
                    i, index = flight.pop(ref)
                    busy[i] -= 1
                    reply = self._get([ref], wait_s)[0]
                    self._check(reply)
                    yield index, reply[1]
        except BaseException:
            self.close()
            raise

    def _get(self, refs: list, timeout: float) -> list:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            raise SandboxError(f"Ray chunk workers did not answer within {timeout:g} s") from None
        except RayActorError as exc:
            raise SandboxError(f"a Ray chunk worker died: {exc}") from None
        except RayTaskError as exc:  # our own code failed in the actor (harness faults are data)
            raise SandboxError(f"a Ray chunk worker failed:\n{exc}") from None

    @staticmethod
    def _check(reply: Any) -> None:
        if reply[0] == "failed":
            raise CandidateFailure(str(reply[2]), str(reply[1]))

    def close(self) -> None:
        import ray

        if not self.actors:
            return
        actors, self.actors = self.actors, []
        try:
            for a in actors:
                a.stop.remote()
            ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=30)
        finally:
            for a in actors:
                ray.kill(a, no_restart=True)


def _register() -> None:
    from evotrainer.sandbox.executor import register_executor

    register_executor("ray", RayExecutor)


_register()

__all__ = ["RayExecutor", "RaySandboxPool", "cluster_cpus", "ensure_ray"]
