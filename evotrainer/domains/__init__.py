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


def _verifiers(env: str = "", env_args: dict | None = None, heldout_fraction: float | None = None,
               system_prompt: bool = True, timeout_s: float = 60.0) -> Domain:
    """verifiers: an installed `verifiers` environment's dataset, scored by its own rubric."""
    from evotrainer.domains.verifiers_env import VerifiersDomain  # imported on use: verifiers is optional

    return VerifiersDomain(env=env, env_args=env_args, heldout_fraction=heldout_fraction,
                           system_prompt=system_prompt, timeout_s=timeout_s)


register("verifiers", _verifiers)


def _bfcl(levels: Any = None, source: str = "procedural", **options: Any) -> Domain:
    """BFCL: single-turn function calling (the Berkeley leaderboard's data), AST-checked calls."""
    from evotrainer.domains.bfcl import BfclDomain  # imported on use: it reads the bfcl-eval wheel's data

    return BfclDomain(levels=levels, source=source, **options)


register("bfcl", _bfcl)


def _tasks(**options: Any) -> Domain:
    """Tasks: your own JSONL task file, checked exactly, numerically, symbolically, by regex or by your function."""
    from evotrainer.domains.tasks import TasksDomain  # imported on use

    return TasksDomain(**options)


register("tasks", _tasks)


def _judged(source: str = "procedural", heldout_source: str | None = None, heldout_fraction: float = 0.2,
            judge: Any = None) -> Domain:
    """Judged tasks: instruction + criteria JSONL; success is the LLM judge panel's unanimous pass."""
    from evotrainer.domains.judged import JudgedDomain  # imported on use: it pulls in the judge

    return JudgedDomain(source, heldout_source, heldout_fraction, judge)


register("judged", _judged)


def _reasoning_gym(generators: Any = None, heldout_fraction: float = 0.2, vet_samples: int = 8,
                   max_answer_chars: int = 2000) -> Domain:
    """reasoning-gym's procedural generators (options.generators), each graded by its vetted scorer."""
    from evotrainer.domains.rgym import make  # imported on use: reasoning-gym is an optional extra

    return make(generators, heldout_fraction, vet_samples, max_answer_chars)


register("reasoning_gym", _reasoning_gym)

__all__ = ["SPLITS", "Domain", "DomainEntry", "DomainError", "Task", "MathDomain", "CodeDomain", "register",
           "available", "build", "build_domain", "get_domain", "resolve"]
