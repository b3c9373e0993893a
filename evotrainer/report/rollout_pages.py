"""The report's rollout browser: static pages, paginated, streamed from the store page by page.

Each round has detail pages (`all-N.html`: every rollout once, in full: prompt, turn by turn
trajectory, patch, per-test results) and one compact listing per (outcome kind, kept or
filtered) cell whose rows link to the rollout on its detail page: a rollout is written once in
full and once as a listing row. Filtering by kind alone or by kept alone opens a small page that
links the cells it spans, so no row is repeated per filter. Rows are read by keyset pages of
one round at a time; row HTML is formatted in Python (100k rows through a template loop is the
slow part) and each page's template is rendered once. Memory holds a page per listing, and no
page grows with the store: a 100k-rollout store makes more pages, not bigger ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from evotrainer.api import JUDGE_VERIFIED, SOURCE_REPORTED
from evotrainer.store import Store

DETAIL_PAGE = 100
LIST_PAGE = 500
FETCH = 2000  # rows per keyset query
PREVIEW = 80
_COLUMNS = ("id", "seq", "round_id", "step", "task_id", "group_id", "domain", "prompt", "completion",
            "turns", "outcome_success", "outcome_score", "outcome_kind", "outcome_flags", "num_tokens",
            "truncated", "meta", "reward_components", "reward", "advantage", "kept", "model_version",
            "harness_version")


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
        """Pages of a facet: detail pages for "all", listing pages for a cell, one filter page
        for a kind alone or a kept label alone."""
        kind, kept = _parse_facet(facet)
        if facet == "all":
            return max(1, math.ceil(self.total / DETAIL_PAGE))
        if kind and kept:
            return max(1, math.ceil(self.facet_count(kind, kept) / LIST_PAGE))
        return 1

    def cells(self, kind: str | None = None, kept: str | None = None) -> list[tuple[str, str, int]]:
        """(kind, kept label, n) of the non-empty cells a filter spans."""
        return [(k, c, n) for (k, c), n in sorted(self.counts.items())
                if n and kind in (None, k) and kept in (None, c)]


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
    labels = {rid: f"{run} · round {idx}" for rid, (run, idx) in store.round_labels().items()}
    out: dict[str, Scope] = {}
    for round_id, kind, kept, n in store.outcome_counts():
        key = scope_key(round_id)
        scope = out.setdefault(key, Scope(key, labels.get(round_id, "no round (imported)"), round_id))
        scope.counts[(kind, kept_label(kept))] = scope.counts.get((kind, kept_label(kept)), 0) + n
    return sorted(out.values(), key=lambda s: (s.round_id is None, s.round_id or 0))


def round_rows(store: Store, round_id: int | None) -> Iterator[dict[str, Any]]:
    """One round's rows in store order, by keyset pages of FETCH (nothing held past a page)."""
    return store.round_rows(round_id, _COLUMNS, page=FETCH)


# ---------------------------------------------------------------- row HTML (formatted, not templated)


def _preview(row: dict) -> str:
    text = row["completion"] if (row["completion"] or "").strip() or not row["turns"] else row["turns"][-1]["content"]
    text = " ".join((text or "").split())
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def _num(v: float | None, d: int = 3) -> str:
    return "–" if v is None else f"{v:+.{d}f}"


def compact_row(row: dict, href: str) -> str:
    """One row of a cell listing (kind and kept are the cell's, so not repeated per row)."""
    return (f'<tr><td><a href="{href}">{_text(row["id"][:14])}</a></td><td>{_text(row["task_id"])}</td>'
            f'<td class="num">{_num(row["reward"])}</td><td class="num">{_num(row["advantage"])}</td>'
            f'<td class="num">{row["num_tokens"]}</td><td class="preview">{_text(_preview(row))}</td></tr>')


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


def _text(value: str) -> str:
    """Escape for element text: quotes stay as they are (they are most of a JSON meta's bytes)."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def detail_html(row: dict, same_prompt_as: str | None = None) -> str:
    """One rollout in full: a summary line that opens to its facts, prompt, turns, patch or
    completion, per-test results and meta. The article's id is the anchor listings link to.
    `same_prompt_as`: the anchor of an earlier rollout on the page with the same prompt (its
    group's first, usually), linked instead of repeating the prompt."""
    meta = row["meta"] or {}
    completion = row["completion"] or ""
    turns = row["turns"] or []
    ok = "ok" if row["outcome_success"] else "fail"
    kept = kept_label(row["kept"])
    comps = "".join(f" {_text(str(k))}={_num(v)}" for k, v in (row["reward_components"] or {}).items()
                    if isinstance(v, (int, float)))
    step = row["step"] if row["step"] is not None else "–"
    rid = row["id"]
    flags = ", ".join(row["outcome_flags"] or ())
    # The judged domain's success is an LLM panel's verdict: labelled so beside every outcome.
    judged = ' <span class="badge judged">judge-verified</span>' if JUDGE_VERIFIED in (row["outcome_flags"] or ()) else ""
    # An imported outcome that another engine reported (api.SOURCE_REPORTED): not our verdict either.
    if SOURCE_REPORTED in (row["outcome_flags"] or ()):
        judged += ' <span class="badge judged">source-reported</span>'
    parts = [
        f'<article class="rollout" id="s{row["seq"]}"><details><summary><code>{_text(rid[:14])}</code> '
        f'<span class="kind {ok}">{_text(row["outcome_kind"])}</span>{judged} <span class="muted">task '
        f'{_text(row["task_id"])} · reward {_num(row["reward"])} · {kept} · {row["num_tokens"]} tokens'
        f'{f" · {len(turns)} turns" if turns else ""}</span></summary><p class="facts">'
        f'{f"id <code>{_text(rid)}</code> · " if len(rid) > 14 else ""}group <code>{_text(row["group_id"])}</code>'
        f' · {"judge-verified " if judged else ""}success {"yes" if row["outcome_success"] else "no"}'
        f' · score {row["outcome_score"]:g}'
        f'{f" · flags {_text(flags)}" if flags else ""} · reward {_num(row["reward"], 4)}'
        f'{f" ({comps.strip()})" if comps else ""} · advantage {_num(row["advantage"], 4)}'
        f'{" · truncated" if row["truncated"] else ""} · step {step} · model {_text(row["model_version"] or "–")}'
        f' · harness <code>{_text((row["harness_version"] or "–")[:8])}</code></p>',
    ]
    if same_prompt_as:
        parts.append(f'<p class="muted">Prompt as in <a href="#{same_prompt_as}">{same_prompt_as}</a>.</p>')
    else:
        parts.append(f'<h4>Prompt</h4><pre class="text">{_text(row["prompt"])}</pre>')
    if turns:
        parts.append('<h4>Trajectory, turn by turn</h4><ol class="turns">')
        parts += [f'<li class="turn {escape(t.get("role", ""))}"><span class="role">{i}. {escape(t.get("role", ""))}'
                  f'</span><pre class="text">{_text(t.get("content", ""))}</pre></li>'
                  for i, t in enumerate(turns, 1)]
        parts.append("</ol>")
    if completion and (row["domain"] == "swe" or looks_like_patch(completion)) and looks_like_patch(completion):
        parts.append(f'<h4>Patch</h4><pre class="diff">{patch_html(completion)}</pre>')
    elif completion or not turns:
        parts.append(f'<h4>Completion</h4><pre class="text {ok}">{_text(completion)}</pre>')
    tests = per_test(meta)
    if tests:
        parts.append('<h4>Grader, per test</h4><div class="scroll"><table><thead><tr><th>test</th><th>result</th>'
                     '</tr></thead><tbody>')
        parts += [f'<tr><td><code>{_text(name)}</code></td><td><span class="test {escape(status)}">'
                  f'{_text(status)}</span></td></tr>' for name, status in tests]
        parts.append("</tbody></table></div>")
    shown = {k: v for k, v in meta.items() if k not in ("per_test", "tests")} if isinstance(meta, dict) else meta
    if shown:
        text = json.dumps(shown, sort_keys=True, ensure_ascii=False, default=str)
        parts.append(f'<details class="meta"><summary>meta</summary><pre class="text">{_text(text)}</pre></details>')
    parts.append("</details></article>\n")
    return "".join(parts)


# ---------------------------------------------------------------- writing the pages


class RolloutWriter:
    """Streams every rollout once, round by round, and writes the detail pages, the cell
    listings and the kind-only / kept-only filter pages."""

    def __init__(self, store: Store, out: Path, render: Callable[[str, dict], str], want: set[str]):
        self.store, self.out, self.render = store, Path(out), render
        self.want = want  # rollout ids other pages link to: their page is recorded in `where`
        self.where: dict[str, str] = {}
        self.scopes = scopes(store)
        self.pages_written = 0

    def _write(self, template: str, scope: Scope, facet: str, page: int, **ctx: Any) -> None:
        kind, kept = _parse_facet(facet)
        html = self.render(template, {"scope": scope, "facet": facet, "kind": kind, "kept": kept, "page": page,
                                      "pages": scope.pages(facet), "root": "../../", "page_path": page_path,
                                      "facet_name": facet_name, "total": scope.facet_count(kind, kept), **ctx})
        path = self.out / page_path(scope.key, facet, page)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
        self.pages_written += 1

    def write(self, on_row: Callable[[], None] | None = None) -> None:
        for scope in self.scopes:
            self._write_scope(scope, on_row)

    def _write_scope(self, scope: Scope, on_row: Callable[[], None] | None) -> None:
        details: list[str] = []
        detail_page = 1
        prompt_at: tuple[str, str] | None = None  # (prompt, anchor) of the last one shown on this page
        cells: dict[str, list[str]] = {}
        cell_page: dict[str, int] = {}
        for row in round_rows(self.store, scope.round_id):
            anchor = f"all-{detail_page}.html#s{row['seq']}"
            if row["id"] in self.want:
                self.where[row["id"]] = f"rollouts/{scope.key}/{anchor}"
            same = prompt_at[1] if prompt_at and prompt_at[0] == row["prompt"] else None
            if same is None:
                prompt_at = (row["prompt"], f"s{row['seq']}")
            details.append(detail_html(row, same))
            if len(details) == DETAIL_PAGE:
                self._write("rollouts_detail.html.j2", scope, "all", detail_page, rows=Markup("".join(details)))
                details, detail_page, prompt_at = [], detail_page + 1, None
            cell = facet_name(row["outcome_kind"], kept_label(row["kept"]))
            listing = cells.setdefault(cell, [])
            listing.append(compact_row(row, anchor))
            if len(listing) == LIST_PAGE:
                self._flush_cell(scope, cell, cells, cell_page)
            if on_row:
                on_row()
        if details:
            self._write("rollouts_detail.html.j2", scope, "all", detail_page, rows=Markup("".join(details)))
        for cell in list(cells):
            if cells[cell]:
                self._flush_cell(scope, cell, cells, cell_page)
        for facet in [facet_name(k, None) for k in sorted({k for k, _ in scope.counts})] + \
                     [facet_name(None, c) for c in sorted({c for _, c in scope.counts})]:
            kind, kept = _parse_facet(facet)
            self._write("rollouts_facet.html.j2", scope, facet, 1, cells=scope.cells(kind, kept))

    def _flush_cell(self, scope: Scope, cell: str, cells: dict[str, list[str]], cell_page: dict[str, int]) -> None:
        page = cell_page.get(cell, 1)
        self._write("rollouts_list.html.j2", scope, cell, page, rows=Markup("".join(cells[cell])))
        cells[cell] = []
        cell_page[cell] = page + 1

    def total(self) -> int:
        return sum(s.total for s in self.scopes)
