"""Where sandboxed jobs run: an Executor protocol, a local process pool, and a name registry.

`get_executor("local", workers=4)` is what configs name; the Ray executor (ray_executor.py)
registers under "ray" with the same two methods. Jobs are module-level functions and picklable items, so
the same call works in-process (workers=1) and in a pool.
"""

from __future__ import annotations

import importlib
import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")
R = TypeVar("R")


@runtime_checkable
class Executor(Protocol):
    """Runs fn over items; results come back in item order."""

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]: ...

    def close(self) -> None: ...


class LocalExecutor:
    """A process pool on this machine. workers=1 runs in the calling process (no pool at all).

    Workers start with "spawn", never "fork": the caller may hold threads (progress bars, the
    sandbox's pipe readers), and a forked copy of a thread-holding process can deadlock.
    """

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        if self.workers == 1:
            return (fn(item) for item in items)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool.map(fn, items)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_REGISTRY: dict[str, Callable[..., Executor]] = {"local": LocalExecutor}
# Registered when first asked for, so `ray` is imported only by runs that use it.
_LAZY = {"ray": "evotrainer.sandbox.ray_executor"}


def register_executor(name: str, factory: Callable[..., Executor]) -> None:
    if name in _REGISTRY and _REGISTRY[name] is not factory:
        raise ValueError(f"executor {name!r} is already registered")
    _REGISTRY[name] = factory


def get_executor(name: str = "local", **options: Any) -> Executor:
    """Build the executor registered as `name` (ValueError lists the known ones)."""
    if name not in _REGISTRY and name in _LAZY:
        importlib.import_module(_LAZY[name])
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown executor {name!r}; known: {', '.join(sorted({*_REGISTRY, *_LAZY}))}") from None
    return factory(**options)
