"""Domains by short name: `get_domain("math", levels=(0, 1))` builds the one a config names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evotrainer.domains.base import SPLITS, Domain, Task

_REGISTRY: dict[str, Callable[..., Domain]] = {}


def register(name: str, factory: Callable[..., Domain] | None = None):
    """Register a domain class (or factory) under `name`; usable as a decorator."""

    def add(f: Callable[..., Domain]) -> Callable[..., Domain]:
        if name in _REGISTRY and _REGISTRY[name] is not f:
            raise ValueError(f"domain {name!r} is already registered")
        _REGISTRY[name] = f
        return f

    return add(factory) if factory is not None else add


def available() -> list[str]:
    return sorted(_REGISTRY)


def get_domain(name: str, **options: Any) -> Domain:
    """Build the domain registered as `name` with its options (TypeError names a bad option)."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown domain {name!r}; known: {', '.join(available())}") from None
    return factory(**options)


from evotrainer.domains.math import MathDomain  # noqa: E402  (registers after the registry exists)

register("math", MathDomain)

from evotrainer.domains.code import CodeDomain  # noqa: E402

register("code", CodeDomain)


def _swe(**options: Any) -> Domain:
    from evotrainer.domains.swe import SweDomain  # imported on use: it pulls in the grader and sandbox

    return SweDomain(**options)


register("swe", _swe)

__all__ = ["SPLITS", "Domain", "Task", "MathDomain", "CodeDomain", "register", "available", "get_domain"]
