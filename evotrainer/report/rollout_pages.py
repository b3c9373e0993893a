"""The report's rollout browser: static pages, paginated, streamed from the store.

Every round gets detail pages (each rollout in full, once: prompt, turn by turn trajectory,
patch, per-test results) and compact filtered listings (by outcome kind, by kept or filtered,
and both) whose rows link to the rollout's place on the detail pages. Rows are read in one
ordered pass and pages are written as they fill, so memory holds one page per listing, and
no page grows with the store: a 100k-rollout store makes more pages, not bigger ones.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from markupsafe import Markup, escape
from sqlalchemy import func, select

from evotrainer.store import Store
from evotrainer.store.models import RolloutRow, Round, Run

DETAIL_PAGE = 50
LIST_PAGE = 200
PREVIEW = 90
_COLUMNS = ("id", "seq", "round_id", "step", "task_id", "group_id", "domain", "prompt", "completion",
            "turns", "outcome_success", "outcome_score", "outcome_kind", "outcome_flags", "num_tokens",
            "truncated", "meta", "reward_components", "reward", "advantage", "kept", "model_version",
            "harness_version", "seed")


def kept_label(kept: bool | None) -> str:
    return "unscored" if kept is None else "kept" if kept else "filtered"


def scope_key(round_id: int | None) -> str:
    return f"r{round_id}" if round_id is not None else "r-none"


def facet_name(kind: str | None, kept: str | None) -> str:
    parts = ([f"k-{kind}"] if kind else []) + ([kept] if kept else [])
    return "-".join(parts) or "all"


@dataclass
class Scope:
    key: str
    label: str
    round_id: int | None
    counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, kept label) -> n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def facet_count(self, kind: str | None, kept: str | None) -> int:
        return sum(n for (k, c), n in self.counts.items() if (kind in (None, k)) and (kept in (None, c)))

    def pages(self, facet: str) -> int:
        kind, kept = _parse_facet(facet)
        size = DETAIL_PAGE if facet == "all" else LIST_PAGE
        return max(1, math.ceil(self.facet_count(kind, kept) / size))

    def facets(self) -> list[tuple[str | None, str | None]]:
        kinds = sorted({k for k, _ in self.counts})
        keeps = sorted({c for _, c in self.counts})
        out: list[tuple[str | None, str | None]] = [(k, None) for k in kinds] + [(None, c) for c in keeps]
        out += [(k, c) for k in kinds for c in keeps if self.counts.get((k, c))]
        return out


def _parse_facet(facet: str) -> tuple[str | None, str | None]:
    if facet == "all":
        return None, None
    kind = kept = None
    rest = facet
    for label in ("kept", "filtered", "unscored"):
        if rest == label or rest.endswith("-" + label):
            kept, rest = label, rest[: -len(label)].rstrip("-")
            break
    if rest.startswith("k-"):
        kind = rest[2:]
    return kind, kept


def page_path(scope: str, facet: str, page: int) -> str:
    """Relative to the report root."""
    return f"rollouts/{scope}/{facet}-{page}.html"


def scopes(store: Store) -> list[Scope]:
    c = RolloutRow.__table__.c
    with store.engine.connect() as conn:
        labels = {rid: f"{run} · round {idx}" for rid, idx, run in conn.execute(
            select(Round.id, Round.index, Run.name).join(Run, Run.id == Round.run_id))}
        rows = conn.execute(select(c.round_id, c.outcome_kind, c.kept, func.count())
                            .group_by(c.round_id, c.outcome_kind, c.kept)).all()
    out: dict[str, Scope] = {}
    for round_id, kind, kept, n in rows:
        key = scope_key(round_id)
        scope = out.setdefault(key, Scope(key, labels.get(round_id, "no round (imported)"), round_id))
        scope.counts[(kind, kept_label(kept))] = scope.counts.get((kind, kept_label(kept)), 0) + n
    return sorted(out.values(), key=lambda s: (s.round_id is None, s.round_id or 0))


def _rows(store: Store) -> Iterable[dict[str, Any]]:
    c = RolloutRow.__table__.c
    query = select(*(c[name] for name in _COLUMNS)).order_by(c.round_id, c.seq)
    with store.engine.connect() as conn:
        result = conn.execution_options(stream_results=True, yield_per=2000).execute(query)
        for row in result:
            yield dict(row._mapping)


def _preview(row: dict) -> str:
    text = row["completion"] if (row["completion"] or "").strip() or not row["turns"] else row["turns"][-1]["content"]
    text = " ".join((text or "").split())
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:+.3f}"


def compact_row(row: dict, href: str) -> str:
    """One listing row as HTML; built with string formatting because 100k of them are written."""
    ok = "ok" if row["outcome_success"] else "fail"
    kept = kept_label(row["kept"])
    return (f'<tr><td><a href="{href}">{escape(row["id"][:14])}</a></td><td>{escape(row["task_id"])}</td>'
            f'<td><span class="kind {ok}">{escape(row["outcome_kind"])}</span></td>'
            f'<td class="num">{_num(row["reward"])}</td><td class="num">{_num(row["advantage"])}</td>'
            f'<td><span class="keep {kept}">{kept}</span></td><td class="num">{row["num_tokens"]}</td>'
            f'<td class="preview">{escape(_preview(row))}</td></tr>')


def looks_like_patch(text: str) -> bool:
    head = text.lstrip()[:200]
    return head.startswith(("diff --git", "--- ", "Index: ")) or ("\n@@ " in text and "\n+++ " in text)


def patch_html(text: str) -> Markup:
    """A unified diff with +/- lines coloured (cheap: no lexer per rollout)."""
    out = []
    for line in text.splitlines():
        cls = ("meta" if line.startswith(("diff ", "index ", "--- ", "+++ ")) else "hunk" if line.startswith("@@")
               else "add" if line.startswith("+") else "del" if line.startswith("-") else "ctx")
        out.append(f'<span class="d-{cls}">{escape(line)}</span>')
    return Markup("\n".join(out))


def per_test(meta: dict) -> list[tuple[str, str]]:
    """The grader's per-test results when a rollout carries them (meta.per_test or meta.tests)."""
    for key in ("per_test", "tests"):
        value = meta.get(key) if isinstance(meta, dict) else None
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return sorted((str(k), v) for k, v in value.items())
    return []


def detail(row: dict) -> dict[str, Any]:
    """What the detail template needs for one rollout."""
    meta = row["meta"] or {}
    completion = row["completion"] or ""
    is_patch = bool(completion) and (row["domain"] == "swe" or looks_like_patch(completion)) and looks_like_patch(completion)
    shown_meta = {k: v for k, v in meta.items() if k not in ("per_test", "tests")}
    return {**row, "anchor": f"s{row['seq']}", "kept_label": kept_label(row["kept"]),
            "patch": patch_html(completion) if is_patch else None, "per_test": per_test(meta),
            "meta_json": json.dumps(shown_meta, indent=1, sort_keys=True, ensure_ascii=False, default=str)
            if shown_meta else "", "flags": ", ".join(row["outcome_flags"] or ())}


class RolloutWriter:
    """Streams every rollout once and writes the detail pages and the filtered listings."""

    def __init__(self, store: Store, out: Path, render: Callable[[str, dict], str], want: set[str]):
        self.store, self.out, self.render = store, Path(out), render
        self.want = want  # rollout ids other pages link to: their page is recorded in `where`
        self.where: dict[str, str] = {}
        self.scopes = scopes(store)
        self.pages_written = 0

    def _write(self, scope: Scope, facet: str, page: int, rows: list, *, detail_page: bool) -> None:
        kind, kept = _parse_facet(facet)
        ctx = {"scope": scope, "facet": facet, "kind": kind, "kept": kept, "page": page,
               "pages": scope.pages(facet), "rows": rows, "root": "../../", "page_path": page_path,
               "facet_name": facet_name, "total": scope.facet_count(kind, kept)}
        html = self.render("rollouts_detail.html.j2" if detail_page else "rollouts_list.html.j2", ctx)
        path = self.out / page_path(scope.key, facet, page)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
        self.pages_written += 1

    def write(self, on_row: Callable[[], None] | None = None) -> None:
        by_key = {s.key: s for s in self.scopes}
        current: Scope | None = None
        buffers: dict[str, list] = defaultdict(list)
        page_no: dict[str, int] = defaultdict(lambda: 1)

        def flush(scope: Scope, facet: str, final: bool = False) -> None:
            rows = buffers[facet]
            size = DETAIL_PAGE if facet == "all" else LIST_PAGE
            if rows and (len(rows) >= size or final):
                self._write(scope, facet, page_no[facet], rows, detail_page=facet == "all")
                page_no[facet] += 1
                buffers[facet] = []

        def close(scope: Scope) -> None:
            for facet in list(buffers):
                flush(scope, facet, final=True)
            buffers.clear()
            page_no.clear()

        for row in _rows(self.store):
            scope = by_key[scope_key(row["round_id"])]
            if scope is not current:
                if current is not None:
                    close(current)
                current = scope
            kept = kept_label(row["kept"])
            href_page = page_path(scope.key, "all", page_no["all"])
            anchor = f"s{row['seq']}"
            if row["id"] in self.want:
                self.where[row["id"]] = f"{href_page}#{anchor}"
            buffers["all"].append(detail(row))
            link = f"all-{page_no['all']}.html#{anchor}"
            line = Markup(compact_row(row, link))
            for facet in (facet_name(row["outcome_kind"], None), facet_name(None, kept),
                          facet_name(row["outcome_kind"], kept)):
                buffers[facet].append(line)
            for facet in ("all", facet_name(row["outcome_kind"], None), facet_name(None, kept),
                          facet_name(row["outcome_kind"], kept)):
                flush(scope, facet)
            if on_row:
                on_row()
        if current is not None:
            close(current)

    def total(self) -> int:
        return sum(s.total for s in self.scopes)
