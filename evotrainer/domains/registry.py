"""Which domain a config names, and how to build it.

`domain.name` is one of three things:
- a name registered in this package (`register("math", MathDomain)`),
- the name of an installed entry point in the group `evotrainer.domains`
  (`[project.entry-points."evotrainer.domains"] mytasks = "mypkg.tasks:make"`),
- a `package.module:factory` path.

A factory is a class or function that takes keyword options and returns a Domain. The config's
common keys (`levels`, `source`, `heldout_source`, `scaffold`) reach it only when its signature
names them; `domain.options` reach it always. A factory may carry a `seed_harness` attribute (a
folder); without one a domain gets the package's own seed of that name, or the generic seed.
A domain is trusted code: it runs in the trainer's process, never in the harness sandbox.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from evotrainer.api import Outcome
from evotrainer.domains.base import Domain, Task
from evotrainer.errors import UserError
from evotrainer.paths import HARNESSES_DIR

ENTRY_POINT_GROUP = "evotrainer.domains"
GENERIC_SEED = "generic"
# The config keys every domain may be given; the rest of a domain's options live in domain.options.
COMMON_KEYS = ("levels", "source", "heldout_source", "scaffold")
# What the trainer hands a factory whose signature names it (never through **kwargs): the
# config's `judge` section, for a domain whose check asks the judge panel.
CONTEXT_KEYS = ("judge",)
# What each common key is when the user did not set it: a factory that cannot take a key is
# only refused when the config sets it to something else.
COMMON_DEFAULTS: dict[str, Any] = {"levels": None, "source": "procedural", "heldout_source": None,
                                   "scaffold": "edit"}

_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_BUILTIN: dict[str, Callable[..., Domain]] = {}


class DomainError(UserError):
    """A domain that cannot be found, loaded or built; the message names it."""


@dataclass(frozen=True)
class DomainEntry:
    """A domain as the registry knows it, before it is built."""

    name: str  # what domain.name says
    kind: str  # builtin, entry point, or module path
    target: str  # the factory's import path
    factory: Callable[..., Domain]

    @property
    def summary(self) -> str:
        doc = inspect.getdoc(self.factory) or ""
        return doc.strip().split("\n", 1)[0]

    def seed_harness(self) -> Path:
        """The folder a new workspace's harness repo starts from."""
        own = getattr(self.factory, "seed_harness", None)
        if own is not None:
            return Path(own)
        shipped = HARNESSES_DIR / self.name
        if self.kind == "builtin" and shipped.is_dir():
            return shipped
        return HARNESSES_DIR / GENERIC_SEED


def register(name: str, factory: Callable[..., Domain] | None = None):
    """Register a domain class (or factory) under `name`; usable as a decorator."""

    def add(f: Callable[..., Domain]) -> Callable[..., Domain]:
        if name in _BUILTIN and _BUILTIN[name] is not f:
            raise ValueError(f"domain {name!r} is already registered")
        _BUILTIN[name] = f
        return f

    return add(factory) if factory is not None else add


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[str]:
    """Every name `domain.name` accepts as a bare name: registered ones and entry points."""
    return sorted(set(_BUILTIN) | set(_entry_points()))


def _import_factory(target: str, what: str) -> Callable[..., Domain]:
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise DomainError(f"{what}: cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:  # the plugin's own import-time error, shown as one line
        raise DomainError(f"{what}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise DomainError(f"{what}: module {module_name!r} has no {attr!r}") from None
    if not callable(obj):
        raise DomainError(f"{what}: {target} is not a class or function")
    return obj


def resolve(spec: str) -> DomainEntry:
    """The entry `domain.name` names; DomainError says what is known when it names nothing."""
    if spec in _BUILTIN:
        factory = _BUILTIN[spec]
        return DomainEntry(spec, "builtin", f"{factory.__module__}:{factory.__qualname__}", factory)
    eps = _entry_points()
    if spec in eps:
        ep = eps[spec]
        return DomainEntry(spec, "entry point", ep.value,
                           _import_factory(ep.value, f"domain {spec!r} (entry point {ep.value})"))
    if ":" in spec:
        if not _PATH.match(spec):
            raise DomainError(f"domain {spec!r}: expected package.module:factory")
        return DomainEntry(spec, "module path", spec, _import_factory(spec, f"domain {spec!r}"))
    raise DomainError(f"unknown domain {spec!r}; known: {', '.join(available())} "
                      "(or give package.module:factory)")


def _accepts(factory: Callable[..., Any]) -> tuple[set[str], bool]:
    """The keyword names a factory takes, and whether it takes **kwargs."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: pass everything
        return set(), True
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def build(spec: str, common: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
          context: Mapping[str, Any] | None = None) -> Domain:
    """Build the domain `spec` names with the config's common keys and its own options; a
    `context` value (CONTEXT_KEYS) only where the signature names it and no option set it."""
    entry = resolve(spec)
    names, takes_any = _accepts(entry.factory)
    kwargs: dict[str, Any] = {}
    for key, value in (common or {}).items():
        is_default = value == COMMON_DEFAULTS.get(key)
        if value is None:
            continue  # unset: the domain's own default
        if key in names or (takes_any and not is_default):
            kwargs[key] = value
        elif not is_default:
            raise DomainError(f"domain {spec!r} does not take domain.{key} (it was set to {value!r})")
    for key, value in (options or {}).items():
        if key in COMMON_KEYS:
            raise DomainError(f"domain.options.{key}: set domain.{key} instead")
        if key not in names and not takes_any:
            known = ", ".join(sorted(names - set(COMMON_KEYS))) or "none"
            raise DomainError(f"domain {spec!r} has no option {key!r} (its options: {known})")
        kwargs[key] = value
    for key, value in (context or {}).items():
        if key in CONTEXT_KEYS and key in names and key not in kwargs:
            kwargs[key] = value
    try:
        domain = entry.factory(**kwargs)
    except (ValueError, TypeError, OSError) as exc:
        raise DomainError(f"domain {spec!r}: {exc}") from None
    if not isinstance(domain, Domain):
        raise DomainError(f"domain {spec!r}: {entry.target} returned {type(domain).__name__}, "
                          "which lacks name, tasks() or check() (evotrainer.domains.Domain)")
    return domain if entry.kind == "builtin" else PluginDomain(spec, domain)


class PluginDomain:
    """A domain from outside the package, under the name the config gave it.

    Its tasks carry that name (the store, the workspace and the report key on it), and a task
    drawn for one split that says it is of another is refused: a plugin that mixed held-out
    tasks into train would make the held-out guard meaningless. Anything else is the plugin's.
    """

    def __init__(self, name: str, inner: Domain) -> None:
        self.name = name
        self.inner = inner

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def _own(self, task: Task, split: str | None = None) -> Task:
        if split is not None and task.split != split:
            raise DomainError(f"domain {self.name!r}: tasks({split!r}, ...) returned {task.task_id!r} "
                              f"of split {task.split!r}")
        return task if task.domain == self.name else replace(task, domain=self.name)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        tasks = [self._own(t, split) for t in self.inner.tasks(split, n, seed)]
        ids = [t.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            raise DomainError(f"domain {self.name!r}: tasks({split!r}, {n}, {seed}) repeats a task id")
        return tasks

    def all_tasks(self) -> list[Task] | None:
        """Every task, when the plugin is finite and says so with all_tasks(); else None."""
        inner = getattr(self.inner, "all_tasks", None)
        return [self._own(t) for t in inner()] if callable(inner) else None

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        try:
            outcome = self.inner.check(task, completion, truncated)
        except Exception:  # the protocol says never raise; a plugin that does still gets a verdict
            return Outcome(False, 0.0, "error", ("checker_error",))
        if not isinstance(outcome, Outcome):
            return Outcome(False, 0.0, "error", ("checker_error",))
        return outcome
