"""SQL pieces the store's modules share: bounded IN lists, the rollout scope, keyset pages on seq."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from sqlalchemy import JSON, Select, Text, cast, select
from sqlalchemy.orm import Session

from evotrainer.store.models import RolloutRow, Round

# Bound-parameter lists stay well under every backend's limit (SQLite's is 32766, old ones 999).
IN_CHUNK = 500


def chunks(items: Iterable[Any], size: int = IN_CHUNK) -> Iterator[list[Any]]:
    """`items` in lists of at most `size`: the one place a long IN (...) list is cut."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def by_id_or_prefix(s: Session, model: type[Any], key: str, what: str) -> Any:
    """The row with this id, else the one whose id starts with it; ValueError if several do."""
    row = s.get(model, key)
    if row is None:
        rows = s.scalars(select(model).where(model.id.startswith(key, autoescape=True)).limit(2)).all()
        if len(rows) > 1:
            raise ValueError(f"{what} id prefix {key!r} is ambiguous")
        row = rows[0] if rows else None
    return row


@dataclass(frozen=True)
class RolloutScope:
    """Which stored rollouts a read covers: a run, a round index (of that run, or of any run),
    a domain, an outcome kind, and rows stored up to `until_seq`. None: no limit on that field."""

    run_id: int | None = None
    round_index: int | None = None
    domain: str | None = None
    kind: str | None = None
    until_seq: int | None = None

    def where(self, query: Select) -> Select:
        c = RolloutRow.__table__.c
        if self.until_seq is not None:
            query = query.where(c.seq <= self.until_seq)
        if self.run_id is not None:
            query = query.where(c.run_id == self.run_id)
        if self.round_index is not None:
            rounds = select(Round.id).where(Round.index == self.round_index)
            if self.run_id is not None:
                rounds = rounds.where(Round.run_id == self.run_id)
            query = query.where(c.round_id.in_(rounds))
        if self.domain is not None:
            query = query.where(c.domain == self.domain)
        if self.kind is not None:
            query = query.where(c.outcome_kind == self.kind)
        return query


def rollout_columns(names: Sequence[str], raw_json: bool = False) -> list[Any]:
    """Columns of the rollouts table by name; with `raw_json`, JSON columns come back as their
    text, unparsed, under the same name."""
    c = RolloutRow.__table__.c
    return [cast(c[n], Text).label(n) if raw_json and isinstance(c[n].type, JSON) else c[n] for n in names]


def keyset_pages(connect: Callable[[], Any], query: Select, size: int) -> Iterator[list[Any]]:
    """`query` over rollouts (it selects `seq`) in store order, `size` rows a page, each page read
    on a connection of its own: keyset on seq, not OFFSET, so late pages cost what early ones do,
    and a slow consumer holds no transaction open."""
    seq = RolloutRow.__table__.c.seq
    last = None
    while True:
        page_query = query if last is None else query.where(seq > last)
        with connect() as conn:
            page = conn.execute(page_query.order_by(seq).limit(size)).all()
        if page:
            yield page
        if len(page) < size:
            return
        last = page[-1].seq


__all__ = ["IN_CHUNK", "RolloutScope", "by_id_or_prefix", "chunks", "keyset_pages", "rollout_columns"]
