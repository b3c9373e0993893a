"""Write the static report: gather the workspace, draw the charts, render the Jinja templates.

    summary = build_report(workdir, out)   # out defaults to <workdir>/report

The site is plain HTML + one CSS file + inline SVG: no scripts, no fonts, nothing fetched.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from evotrainer.coevolve.state import RunState
from evotrainer.errors import UserError
from evotrainer.harness.repo import HarnessRepo
from evotrainer.report import gather
from evotrainer.report.charts import Histogram, Marker, Series, histogram_chart, line_chart
from evotrainer.report.rollout_pages import RolloutWriter, facet_name, page_path
from evotrainer.store import Store
from evotrainer.workspace import Workspace

PAGES = (("index.html", "Overview"), ("lineage.html", "Harness lineage"), ("agent.html", "Agent transcripts"),
         ("backtests.html", "Backtests"),
         ("diagnostics.html", "Diagnostics"), ("rollouts/index.html", "Rollouts"), ("skills.html", "Skills"))
SUCCESS, FAILURE = "#2ca02c", "#d62728"


class ReportError(UserError):
    """A workspace the report cannot be built from; the message names the folder."""


@dataclass
class ReportSummary:
    out: Path
    pages: int
    rollouts: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)


def _env() -> Environment:
    env = Environment(loader=PackageLoader("evotrainer.report", "templates"), undefined=StrictUndefined,
                      autoescape=select_autoescape(["html", "j2"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = lambda v, d=3: "–" if v is None else f"{v:.{d}f}"
    env.filters["signed"] = lambda v, d=4: "–" if v is None else f"{v:+.{d}f}"
    env.filters["short"] = lambda v, n=8: (v or "")[:n]
    return env


def highlight(text: str, lexer: str) -> Markup:
    """Syntax-highlighted HTML (pygments), or plain escaped text when pygments is missing."""
    try:
        from pygments import highlight as pyg
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import get_lexer_by_name
    except ImportError:  # pragma: no cover - pygments comes with rich
        from markupsafe import escape

        return Markup(f'<pre class="code">{escape(text)}</pre>')
    return Markup(pyg(text, get_lexer_by_name(lexer), HtmlFormatter(cssclass="hl code")))


def _css() -> str:
    css = resources.files("evotrainer.report").joinpath("templates", "style.css").read_text(encoding="utf-8")
    try:
        from pygments.formatters import HtmlFormatter

        css += "\n" + HtmlFormatter(style="friendly").get_style_defs(".hl")
    except ImportError:  # pragma: no cover
        pass
    return css


def overview_chart(rounds: list[dict], lineage: dict) -> str:
    heldout = [(r["index"], r["heldout_success"]) for r in rounds if r["heldout_success"] is not None]
    reward = [(r["index"], r["train_reward"]) for r in rounds if r["train_reward"] is not None]
    markers = []
    for c in lineage["commits"]:
        if c["kind"] in ("promotion", "revert") and c["round"] is not None:
            # A promotion after round k trains from round k+1; a revert decided in round k's
            # verification is live from round k+1 too: both sit between the rounds.
            label = (c["trailers"].get("Candidate", c["subject"]) if c["kind"] == "promotion"
                     else f"revert: {c['trailers'].get('Candidate', c['subject'])}")
            kind = "promote" if c["kind"] == "promotion" else "revert"
            markers.append(Marker(c["round"] + (0.6 if kind == "promote" else 0.4), label, kind))
    # Judge-verified (an LLM panel's verdict) is named so wherever it is plotted, never "verified".
    which = "judge-verified" if any(r.get("judge_verified") for r in rounds) else "verified"
    return line_chart([Series(f"held-out {which} success (fraction)", heldout, SUCCESS),
                       Series("mean training reward (harness units)", reward, "#1f77b4", dashed=True)],
                      x_label="round", y_label="success rate / reward",
                      title=f"Held-out {which} success and training reward by round", markers=markers)


def distribution_chart(dist: dict) -> str:
    """The ordering chart from a reward histogram (backtest.metrics.reward_histogram)."""
    strips = []
    for side in ("base", "candidate"):
        for outcome, colour in (("success", SUCCESS), ("failure", FAILURE)):
            strips.append(Histogram(f"verified {outcome}", list(zip(dist["values"], dist[side][outcome])),
                                    colour, side))
    edges = dist.get("edges")
    width = (edges[1] - edges[0]) if not dist.get("exact", True) and edges and len(edges) > 1 else 0.0
    return histogram_chart(strips, y_label="training reward (harness units)", bin_width=width,
                           title="Training reward of verified successes and failures, base vs candidate")


def backtest_charts(bts: list[dict], store: Store | None, ws: Workspace) -> None:
    """Each backtest's ordering chart and its caption note. Reports keep their distribution
    (`reward_distribution`); only older ones are replayed here, in the harness sandbox."""
    old = [bt for bt in bts if not bt.get("reward_distribution") and (bt.get("metrics") or {}).get("base")]
    replayed: dict[str, dict] = {}
    if old and store and ws.exists():
        from evotrainer.report.distributions import reward_distributions

        replayed = reward_distributions(store, HarnessRepo(ws.harnesses), old)
    for bt in bts:
        stored = bt.get("reward_distribution")
        d = stored or replayed.get(bt["id"])
        bt["chart"] = Markup(distribution_chart(d)) if d and "error" not in d else ""
        binned = "" if not d or d.get("exact", True) else f", in {len(d['values'])} bins"
        if stored:
            bt["chart_note"] = f"All {bt['n_rollouts']} rollouts, as the backtest scored them{binned}"
        elif d and "error" not in d:
            bt["chart_note"] = (f"This backtest predates stored distributions: recomputed for the report by "
                                f"replaying both harnesses over {d['n']} of its rollouts{binned}")
        else:
            bt["chart_note"] = (d or {}).get("error") or "no chart: the backtest has no metrics"


@dataclass
class _Gathered:
    """What the pages show, read from the workspace while its store is open."""

    state: RunState | None
    rounds: list[dict]
    base: dict[str, float]
    skills: list[dict]
    backtests: list[dict]
    lineage: dict
    diagnostics: list[dict]
    transcripts: list[dict] = field(default_factory=list)  # the outer agent's tool calls (report/transcripts.py)
    judged_runs: set[str] = field(default_factory=set)  # runs whose held-out success is judge-verified
    agreement: dict | None = None  # the judge against people (<workdir>/judge_agreement.json)

    @property
    def by_id(self) -> dict[str, dict]:
        return {b["id"]: b for b in self.backtests}


class _Laps:
    """Seconds per stage of the build, for ReportSummary.timings."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.tick = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self.tick, 3)
        self.tick = now


def build_report(workdir: Path | str, out: Path | str | None = None,
                 on_progress: Callable[[int, int], None] | None = None) -> ReportSummary:
    """Build the site for `workdir` into `out` (default <workdir>/report); return what was written."""
    start = time.perf_counter()
    ws = _workspace(workdir)
    out = _empty_out(Path(out) if out is not None else ws.report)
    env, lap = _env(), _Laps()
    store = Store.open(ws.root) if ws.store_path.exists() else None
    try:
        data = _gather(ws, store)
        lap("gather")
        backtest_charts(data.backtests, store, ws)
        lap("distributions")
        writer, n_rollouts = _write_rollouts(env, store, out, data.diagnostics, on_progress)
        lap("rollouts")
    finally:
        if store:
            store.close()
    _highlight_code(data)
    pages = _pages(data, writer)
    _write_pages(env, out, pages, ws, data.state)
    lap("pages")
    written = len(pages) + (writer.pages_written if writer else 0)
    return ReportSummary(out, written, n_rollouts, time.perf_counter() - start, lap.timings)


def _workspace(workdir: Path | str) -> Workspace:
    ws = Workspace(workdir)
    if not ws.root.is_dir():
        raise ReportError(f"{ws.root}: no such workspace folder")
    if not ws.store_path.exists() and not ws.exists():
        raise ReportError(f"{ws.root}: neither store.db nor a harness repo here; is this a workspace?")
    return ws


def _empty_out(out: Path) -> Path:
    """`out`, emptied; a folder that holds anything but an earlier report is never deleted."""
    if out.exists():
        if any(out.iterdir()) and not (out / "index.html").exists():
            raise ReportError(f"{out}: exists, is not empty and is not a report; pick another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


def _gather(ws: Workspace, store: Store | None) -> _Gathered:
    state = gather.load_state(ws.root)
    rounds = gather.rounds(store, state) if store else []
    base = gather.base_success(store) if store else {}
    skills = gather.skills(ws)
    bts = gather.backtests(ws, store)
    lineage = gather.lineage(ws, {b["id"]: b for b in bts}, skills, state)
    from evotrainer.report.transcripts import transcripts

    return _Gathered(state, rounds, base, skills, bts, lineage, gather.diagnostics(ws), transcripts(ws),
                     gather.judged_runs(store) if store else set(), gather.judge_agreement(ws.root))


def _write_rollouts(env: Environment, store: Store | None, out: Path, diags: list[dict],
                    on_progress: Callable[[int, int], None] | None) -> tuple[RolloutWriter | None, int]:
    """The rollout pages (none without a store), and how many rollouts they hold. The rollouts
    that diagnostics cite as examples are the ones whose pages they link to."""
    if store is None:
        return None, 0
    want = {rid for d in diags for p in d["alerts"] for rid in p.examples}
    writer = RolloutWriter(store, out, lambda t, ctx: env.get_template(t).render(
        nav=PAGES, current="rollouts/index.html", **ctx), want)
    total, done = writer.total(), 0

    def step() -> None:
        nonlocal done
        done += 1
        if on_progress and (done % 500 == 0 or done == total):
            on_progress(done, total)

    writer.write(step)
    return writer, total


def _highlight_code(data: _Gathered) -> None:
    """Highlighted HTML beside each commit's diff and each skill's templates."""
    for c in data.lineage["commits"] + data.lineage["rejected"]:
        c["diff_html"] = highlight(c["diff"], "diff") if c["diff"] else ""
    for s in data.skills:
        s["templates_html"] = {name: highlight(text, "jinja" if name.endswith(".j2") else "text")
                               for name, text in s["templates"].items()}


def _pages(data: _Gathered, writer: RolloutWriter | None) -> dict[str, tuple[str, dict]]:
    """Each top-level page: its template and what it shows."""
    by_id, known_commits = data.by_id, {c["sha"] for c in data.lineage["commits"]}
    return {
        "index.html": ("overview.html.j2", {"rounds": data.rounds, "base": data.base, "commit_shas": known_commits,
                                           "judged_runs": data.judged_runs, "agreement": data.agreement,
                                           "chart": Markup(overview_chart(data.rounds, data.lineage))}),
        "lineage.html": ("lineage.html.j2", {"lineage": data.lineage, "backtests": by_id,
                                             "transcripts": data.transcripts}),
        "agent.html": ("agent.html.j2", {"transcripts": data.transcripts}),
        "backtests.html": ("backtests.html.j2", {"backtests": data.backtests, "lineage": data.lineage}),
        "diagnostics.html": ("diagnostics.html.j2", {"diagnostics": data.diagnostics,
                                                     "where": writer.where if writer else {}}),
        "rollouts/index.html": ("rollouts_index.html.j2", {"scopes": writer.scopes if writer else [],
                                                           "page_path": page_path, "facet_name": facet_name}),
        "skills.html": ("skills.html.j2", {"skills": data.skills, "backtests": by_id, "commits": known_commits}),
    }


def _write_pages(env: Environment, out: Path, pages: dict[str, tuple[str, dict]], ws: Workspace,
                 state: RunState | None) -> None:
    common = {"nav": PAGES, "workdir": str(ws.root.resolve()), "state": state,
              "generated": time.strftime("%Y-%m-%d %H:%M")}
    for name, (template, ctx) in pages.items():
        root = "../" * name.count("/")
        html = env.get_template(template).render(root=root, current=name, **common, **ctx)
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(html, encoding="utf-8")
    (out / "style.css").write_text(_css(), encoding="utf-8")
