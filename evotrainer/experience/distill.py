"""Distilling lessons from stored rollouts: the Distiller protocol, its registry, and the run.

A distiller reads groups of stored rollouts (a group is one task sampled several times, so a
failure often has a successful sibling to contrast with) and returns lesson drafts. Rollouts of
the held-out split never reach a distiller: a lesson learned from them would carry held-out
signal into training prompts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from evotrainer.store import Store, StoredRollout

SOURCES = ("rules", "llm")
MAX_LESSON_CHARS = 400


@dataclass(frozen=True)
class LessonDraft:
    """A lesson before it is stored: its id is a hash of domain and normalised text."""

    domain: str
    text: str
    source: str  # "rules" | "llm"
    kind: str  # the rule, or the failure kind it addresses
    support: int  # failed rollouts behind it
    evidence: tuple[str, ...] = ()  # rollout ids
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return lesson_id(self.domain, self.text)

    def to_row(self) -> dict[str, Any]:
        return {"id": self.id, "domain": self.domain, "text": self.text, "source": self.source,
                "kind": self.kind, "support": self.support, "evidence": list(self.evidence),
                "meta": dict(self.meta)}


def lesson_id(domain: str, text: str) -> str:
    """12 hex chars; case and spacing do not make a new lesson."""
    norm = " ".join(text.lower().split())
    return hashlib.sha256(f"{domain}\0{norm}".encode()).hexdigest()[:12]


class Distiller(Protocol):
    """Turns groups of stored rollouts (one domain) into lesson drafts."""

    name: str

    def distill(self, domain: str, groups: Sequence[Sequence[StoredRollout]]) -> list[LessonDraft]: ...


_DISTILLERS: dict[str, Callable[..., Distiller]] = {}


def register_distiller(name: str):
    def wrap(cls):
        _DISTILLERS[name] = cls
        return cls
    return wrap


def get_distiller(name: str, **options: Any) -> Distiller:
    # The built-in distillers register on import; the llm one pulls in the SDK only when asked.
    from evotrainer.experience import llm, rules  # noqa: F401

    if name not in _DISTILLERS:
        raise ValueError(f"unknown distiller {name!r}; known: {', '.join(sorted(_DISTILLERS))}")
    return _DISTILLERS[name](**options)


def training_groups(rollouts: Iterable[StoredRollout]) -> dict[str, list[StoredRollout]]:
    """Rollouts by group id, in store order, held-out ones left out."""
    groups: dict[str, list[StoredRollout]] = {}
    for sr in rollouts:
        if sr.rollout.meta.get("split") == "heldout":
            continue
        groups.setdefault(sr.rollout.group_id or sr.rollout.id, []).append(sr)
    return groups


@dataclass
class DistillSummary:
    domain: str
    groups: int
    rollouts: int
    drafts: list[LessonDraft]
    added: int
    updated: int


def distill_store(store: Store, distiller: Distiller, domain: str | None = None, run_id: int | None = None,
                  round_index: int | None = None, limit: int | None = None,
                  on_rollout: Callable[[], None] | None = None) -> list[DistillSummary]:
    """Distill lessons from stored rollouts (one domain, or each domain present; optionally one
    run or round) and upsert them into the store's experience pool. One summary per domain."""
    by_domain: dict[str, list[StoredRollout]] = {}
    for sr in store.iter_rollouts(run_id=run_id, round_index=round_index, domain=domain, limit=limit):
        by_domain.setdefault(sr.rollout.domain, []).append(sr)
        if on_rollout is not None:
            on_rollout()
    summaries = []
    for name, rows in sorted(by_domain.items()):
        groups = training_groups(rows)
        drafts = distiller.distill(name, list(groups.values()))
        added, updated = store.add_lessons(d.to_row() for d in drafts)
        summaries.append(DistillSummary(name, len(groups), sum(len(g) for g in groups.values()),
                                        drafts, added, updated))
    return summaries
