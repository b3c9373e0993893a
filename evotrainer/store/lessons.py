"""The experience pool's rows (evotrainer/experience): lessons and their cached embeddings, part of Store."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from evotrainer.store.models import Lesson, LessonEmbedding, utcnow
from evotrainer.store.sql import by_id_or_prefix, chunks

# Rollout ids kept as a lesson's evidence: enough to show and audit it, not every failure.
_LESSON_EVIDENCE = 50


class LessonRows:
    """Store's lesson methods (a mixin: it uses the Store's sessions)."""

    _session: sessionmaker[Session]

    def add_lessons(self, lessons: Iterable[dict]) -> tuple[int, int]:
        """Upsert lessons by id; returns (added, updated). A lesson distilled again keeps the
        larger support, and its evidence grows up to _LESSON_EVIDENCE rollout ids."""
        added = updated = 0
        with self._session.begin() as s:
            for chunk in chunks(lessons):
                by_id = {item["id"]: item for item in chunk}
                existing = {row.id: row for row in s.scalars(select(Lesson).where(Lesson.id.in_(list(by_id))))}
                for lesson_id, item in by_id.items():
                    evidence = [str(e) for e in item.get("evidence") or ()]
                    row = existing.get(lesson_id)
                    if row is None:
                        s.add(Lesson(id=lesson_id, domain=item["domain"], text=item["text"],
                                     source=item["source"], kind=item.get("kind") or "",
                                     support=int(item.get("support") or 0),
                                     evidence=evidence[:_LESSON_EVIDENCE], meta=dict(item.get("meta") or {})))
                        added += 1
                        continue
                    row.support = max(row.support, int(item.get("support") or 0))
                    row.evidence = list(dict.fromkeys([*(row.evidence or ()), *evidence]))[:_LESSON_EVIDENCE]
                    row.meta = {**(row.meta or {}), **(item.get("meta") or {})}
                    row.updated_at = utcnow()
                    updated += 1
        return added, updated

    def lessons(self, domain: str | None = None, source: str | None = None,
                limit: int | None = None) -> list[dict[str, Any]]:
        """Lessons, best supported first."""
        query = select(Lesson).order_by(Lesson.support.desc(), Lesson.id)
        if domain is not None:
            query = query.where(Lesson.domain == domain)
        if source is not None:
            query = query.where(Lesson.source == source)
        if limit is not None:
            query = query.limit(limit)
        with self._session() as s:
            return [_lesson_dict(row) for row in s.scalars(query)]

    def get_lesson(self, lesson_id: str) -> dict[str, Any] | None:
        """The lesson with this id or unique id prefix; ValueError if ambiguous."""
        with self._session() as s:
            row = by_id_or_prefix(s, Lesson, lesson_id, "lesson")
            return _lesson_dict(row) if row else None

    def lesson_vectors(self, model: str, ids: Iterable[str]) -> dict[str, bytes]:
        """Cached embeddings (float32 bytes) of these lessons under `model`; missing ones are absent."""
        found: dict[str, bytes] = {}
        with self._session() as s:
            for chunk in chunks(dict.fromkeys(ids)):
                query = select(LessonEmbedding.lesson_id, LessonEmbedding.vector).where(
                    LessonEmbedding.model == model, LessonEmbedding.lesson_id.in_(chunk))
                found.update((lid, bytes(vec)) for lid, vec in s.execute(query))
        return found

    def put_lesson_vectors(self, model: str, dim: int, vectors: dict[str, bytes]) -> None:
        """Cache lesson embeddings under `model` (a vector already cached is replaced)."""
        with self._session.begin() as s:
            for lesson_id, vector in vectors.items():
                s.merge(LessonEmbedding(lesson_id=lesson_id, model=model, dim=dim, vector=vector))


def _lesson_dict(row: Lesson) -> dict[str, Any]:
    return {"id": row.id, "domain": row.domain, "text": row.text, "source": row.source, "kind": row.kind,
            "support": row.support, "evidence": list(row.evidence or ()), "meta": dict(row.meta or {}),
            "created_at": row.created_at.isoformat(), "updated_at": row.updated_at.isoformat()}
