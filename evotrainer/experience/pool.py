"""The experience pool: stored lessons, retrieved by embedding similarity to a query.

Lesson vectors are cached in the store per embedding model (a lesson's id hashes its text, so a
cached vector never goes stale); only lessons without one are embedded. A pool snapshots each
domain's lessons on first use, since lessons do not change while a round trains; `refresh()`
drops the snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evotrainer.experience.embed import Embedder, from_bytes, get_embedder, to_bytes
from evotrainer.store import Store


@dataclass(frozen=True)
class Lesson:
    id: str
    domain: str
    text: str
    source: str
    kind: str
    support: int
    evidence: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Lesson:
        return cls(row["id"], row["domain"], row["text"], row["source"], row["kind"], row["support"],
                   tuple(row.get("evidence") or ()), dict(row.get("meta") or {}))


@dataclass(frozen=True)
class Hit:
    lesson: Lesson
    score: float  # cosine similarity to the query


class ExperiencePool:
    def __init__(self, store: Store, embedder: Embedder | None = None, embedder_name: str = "minilm") -> None:
        self.store = store
        self._embedder = embedder
        self._embedder_name = embedder_name
        self._snapshots: dict[str | None, tuple[list[Lesson], np.ndarray]] = {}

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = get_embedder(self._embedder_name)
        return self._embedder

    def refresh(self) -> None:
        self._snapshots.clear()

    def lessons(self, domain: str | None = None) -> list[Lesson]:
        return self._snapshot(domain)[0]

    def _snapshot(self, domain: str | None) -> tuple[list[Lesson], np.ndarray]:
        if domain not in self._snapshots:
            lessons = [Lesson.from_row(r) for r in self.store.lessons(domain=domain)]
            self._snapshots[domain] = (lessons, self.vectors(lessons))
        return self._snapshots[domain]

    def vectors(self, lessons: Sequence[Lesson]) -> np.ndarray:
        """(n, dim) unit vectors of these lessons: from the store's cache, else embedded and cached."""
        emb = self.embedder
        cached = self.store.lesson_vectors(emb.name, [lesson.id for lesson in lessons])
        missing = [lesson for lesson in lessons if lesson.id not in cached]
        if missing:
            fresh = emb.embed([lesson.text for lesson in missing])
            new = {lesson.id: to_bytes(v) for lesson, v in zip(missing, fresh)}
            self.store.put_lesson_vectors(emb.name, emb.dim, new)
            cached.update(new)
        if not lessons:
            return np.zeros((0, emb.dim), dtype=np.float32)
        return np.stack([from_bytes(cached[lesson.id]) for lesson in lessons])

    def search(self, query: str, domain: str | None = None, k: int = 5, min_score: float = -1.0) -> list[Hit]:
        return self.search_many([query], domain, k, min_score)[0]

    def search_many(self, queries: Sequence[str], domain: str | None = None, k: int = 5,
                    min_score: float = -1.0) -> list[list[Hit]]:
        """The k most similar lessons (score >= min_score) for each query, best first."""
        lessons, matrix = self._snapshot(domain)
        if not lessons or not queries:
            return [[] for _ in queries]
        scores = self.embedder.embed(list(queries)) @ matrix.T
        results = []
        for row in scores:
            # Ties (the same score) go to the better supported lesson: store order.
            order = np.argsort(-row, kind="stable")[:k]
            results.append([Hit(lessons[i], float(row[i])) for i in order if row[i] >= min_score])
        return results
