"""Domains: a task source plus its trusted check. `build_domain(config.domain)` makes the one a
config names: a registered name, an entry point in `evotrainer.domains`, or package.module:factory
(evotrainer/domains/registry.py; the contract is docs/domains.md)."""

from __future__ import annotations

from typing import Any

from evotrainer.domains.base import SPLITS, Domain, Task
from evotrainer.domains.registry import (
    COMMON_KEYS,
    DomainEntry,
    DomainError,
    available,
    build,
    register,
    resolve,
)
from evotrainer.paths import HARNESSES_DIR


def get_domain(name: str, **options: Any) -> Domain:
    """Build the domain `name` names; common keys (levels, source, ...) and its own options alike."""
    common = {k: options.pop(k) for k in COMMON_KEYS if k in options}
    return build(name, common, options)


def build_domain(cfg: Any) -> Domain:
    """The domain a `DomainConfig` describes."""
    return build(cfg.name, {k: getattr(cfg, k) for k in COMMON_KEYS}, cfg.options)


from evotrainer.domains.math import MathDomain  # noqa: E402  (registers after the registry exists)

register("math", MathDomain)

from evotrainer.domains.code import CodeDomain  # noqa: E402

register("code", CodeDomain)


def _swe(levels: Any = None, source: str = "procedural", scaffold: str = "edit", **options: Any) -> Domain:
    """SWE: fix a bug in a small repo; graded by its hidden tests in the sandbox."""
    from evotrainer.domains.swe import SweDomain  # imported on use: it pulls in the grader and sandbox

    return SweDomain(**({"levels": levels} if levels is not None else {}), source=source,
                     scaffold=scaffold, **options)


register("swe", _swe)


def _reasoning_gym(generators: Any = None, heldout_fraction: float = 0.2, vet_samples: int = 8,
                   max_answer_chars: int = 2000) -> Domain:
    """reasoning-gym's procedural generators (options.generators), each graded by its vetted scorer."""
    from evotrainer.domains.rgym import make  # imported on use: reasoning-gym is an optional extra

    return make(generators, heldout_fraction, vet_samples, max_answer_chars)


_reasoning_gym.seed_harness = HARNESSES_DIR / "reasoning_gym"  # type: ignore[attr-defined]
register("reasoning_gym", _reasoning_gym)

__all__ = ["SPLITS", "Domain", "DomainEntry", "DomainError", "Task", "MathDomain", "CodeDomain", "register",
           "available", "build", "build_domain", "get_domain", "resolve"]
