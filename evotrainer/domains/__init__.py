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


def get_domain(name: str, **options: Any) -> Domain:
    """Build the domain `name` names; common keys (levels, source, ...) and its own options alike."""
    common = {k: options.pop(k) for k in COMMON_KEYS if k in options}
    return build(name, common, options)


def build_domain(cfg: Any, judge: Any = None) -> Domain:
    """The domain a `DomainConfig` describes; `judge` (config.judge) reaches a factory that names it."""
    return build(cfg.name, {k: getattr(cfg, k) for k in COMMON_KEYS}, cfg.options,
                 {"judge": judge} if judge is not None else None)


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


def _judged(source: str = "procedural", heldout_source: str | None = None, heldout_fraction: float = 0.2,
            judge: Any = None) -> Domain:
    """Judged tasks: instruction + criteria JSONL; success is the LLM judge panel's unanimous pass."""
    from evotrainer.domains.judged import JudgedDomain  # imported on use: it pulls in the judge

    return JudgedDomain(source, heldout_source, heldout_fraction, judge)


register("judged", _judged)

__all__ = ["SPLITS", "Domain", "DomainEntry", "DomainError", "Task", "MathDomain", "CodeDomain", "register",
           "available", "build", "build_domain", "get_domain", "resolve"]
