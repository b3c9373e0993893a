"""The static report, built from real workspaces: a real SQLite store, a real harness git repo
written by the outer loop's own stages, real backtest reports. Every page is opened in headless
Chromium (Debian's `chromium`) at desktop and phone sizes."""

from __future__ import annotations

import json
import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from evotrainer.report import ReportError, build_report
from evotrainer.report.rollout_pages import DETAIL_PAGE, LIST_PAGE
from evotrainer.store import Store

sys.path.insert(0, str(Path(__file__).parent))
from chromium import Browser, find_chromium
from report_workspace import _rows, build_workspace


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "script":
            self.scripts += 1
        for key in ("href", "src"):
            if a.get(key) and not (tag == "svg"):
                self.links.append(a[key])


def _parse(path: Path) -> _Links:
    p = _Links()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def check_site(out: Path) -> list[Path]:
    """Every page's links resolve to a file (and a fragment to an id in it); nothing external."""
    pages = sorted(out.rglob("*.html"))
    parsed = {p.resolve(): _parse(p) for p in pages}
    bad = []
    for page, info in parsed.items():
        assert info.scripts == 0, f"{page}: has a <script>"
        for link in info.links:
            if link.startswith("data:"):
                continue
            parts = urlsplit(link)
            assert not parts.scheme and not parts.netloc, f"{page}: external link {link}"
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if not target.is_file():
                bad.append(f"{page.relative_to(out.resolve())}: {link} (no file)")
            elif parts.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _parse(target).ids
                if parts.fragment not in ids:
                    bad.append(f"{page.relative_to(out.resolve())}: {link} (no id)")
    assert not bad, "\n".join(bad[:20])
    return pages


def test_report_paginates_and_filters_a_store_only_workspace(tmp_path):
    """No harness repo, no loop: two rounds of stored rollouts still give a complete site whose
    listings hold every rollout exactly once per facet, in pages of a fixed size."""
    ws = tmp_path / "ws"
    with Store.open(ws) as store:
        run_id = store.get_or_create_run("plain", "math", {})
        for k in range(2):
            round_id = store.start_round(run_id, k, "seed", f"lora-{k}")
            for rep in range(2):  # 128 rows a round: 3 detail pages
                rows = _rows(run_id, round_id, k, "seed")
                store.add_rollouts([type(r)(type(r.rollout)(**{**r.rollout.__dict__, "id": f"{r.rollout.id}-{rep}",
                                                                "group_id": f"{r.rollout.group_id}-{rep}"}),
                                            r.reward_components, r.reward, r.advantage, r.kept, r.model_version,
                                            r.seed, r.harness_version, r.run_id, r.round_id, r.step)
                                    for r in rows])
            store.finish_round(round_id, {"heldout_success": 0.3 + 0.1 * k, "train_reward": 0.2}, None)
    summary = build_report(ws)
    out = ws / "report"
    assert summary.out == out and summary.rollouts == 256
    check_site(out)
    detail = sorted((out / "rollouts").glob("r*/all-*.html"))
    assert len(detail) == 2 * -(-128 // DETAIL_PAGE)
    seen = [m for p in detail for m in re.findall(r'id="s(\d+)"', p.read_text())]
    assert len(seen) == len(set(seen)) == 256  # every rollout once, in full

    def listed(pattern: str) -> list[str]:
        """Row links of the cell listings whose facet matches `pattern` (every page of each)."""
        return [href for p in (out / "rollouts").glob("r*/*.html") if re.fullmatch(pattern + r"-\d+\.html", p.name)
                for href in re.findall(r'<tr><td><a href="([^"]+)"', p.read_text())]

    cells = listed(r"k-[a-z_]+-(kept|filtered|unscored)")
    assert len(cells) == len(set(cells)) == 256  # and once as a listing row, in its (kind, kept) cell
    with Store.open(ws) as store:
        assert len(listed(r"k-wrong-(kept|filtered)")) == store.count_rollouts(kind="wrong")
    assert len(listed(r"k-[a-z_]+-filtered")) == 2 * 2 * 8  # j == 7 of every group is filtered
    # Filtering by one dimension opens a page that links the cells it spans, not a copy of them.
    wrong = (out / "rollouts" / "r1" / "k-wrong-1.html").read_text()
    assert 'href="k-wrong-kept-1.html"' in wrong and 'href="k-wrong-filtered-1.html"' in wrong
    assert "<tr><td><a href=\"all-" not in wrong
    overview = (out / "index.html").read_text()
    assert "0.400" in overview and 'class="chart"' in overview and "datum" in overview
    assert "no harness repo" in (out / "lineage.html").read_text()
    assert LIST_PAGE >= DETAIL_PAGE
    # A folder that holds something else is never deleted.
    other = tmp_path / "precious"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(ReportError):
        build_report(ws, other)
    assert (other / "notes.txt").read_text() == "keep"


def test_reward_histogram_is_bounded_and_exact_when_small():
    from evotrainer.backtest.metrics import HISTOGRAM_BINS, reward_histogram

    small = reward_histogram({"base": {0.0: [1, 5], 1.0: [4, 0]}, "candidate": {0.5: [2, 1]}})
    assert small == {"exact": True, "values": [0.0, 0.5, 1.0],
                     "base": {"success": [1, 0, 4], "failure": [5, 0, 0]},
                     "candidate": {"success": [0, 2, 0], "failure": [0, 1, 0]}}
    many = {i / 1000: [i % 2, 1 - i % 2] for i in range(1001)}
    big = reward_histogram({"base": many, "candidate": {0.0: [3, 0]}})
    assert not big["exact"] and len(big["values"]) == HISTOGRAM_BINS == len(big["edges"]) - 1
    assert sum(big["base"]["success"]) == 500 and sum(big["base"]["failure"]) == 501
    assert big["base"]["failure"][-1] > 0 and big["candidate"]["success"][0] == 3  # ends land in the end bins


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    old = os.environ.get("EVOTRAINER_SWE_CACHE")
    os.environ["EVOTRAINER_SWE_CACHE"] = str(tmp_path_factory.mktemp("swe-cache"))
    try:
        yield build_workspace(tmp_path_factory.mktemp("report"))
    finally:
        if old is None:
            os.environ.pop("EVOTRAINER_SWE_CACHE", None)
        else:
            os.environ["EVOTRAINER_SWE_CACHE"] = old


CHART_DATA = """(() => [...document.querySelectorAll('svg.chart')].map(svg => {
  const box = svg.getBoundingClientRect();
  const drawn = [...svg.querySelectorAll('.datum')].filter(el => {
    const b = el.getBBox(); return b.width > 0 || b.height > 0; }).length;
  return {w: box.width, h: box.height, drawn};
}))()"""


@pytest.mark.slow
def test_every_page_in_headless_chromium(workspace, tmp_path, artifacts_dir):
    binary = find_chromium()
    if binary is None:
        if os.environ.get("EVOTRAINER_REQUIRE_CHROMIUM"):
            pytest.fail("EVOTRAINER_REQUIRE_CHROMIUM is set but chromium is not installed")
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium; .ci/run does it)")
    out = tmp_path / "site"
    # One report as written before backtests kept their reward distribution: the report replays
    # the harnesses for that one (and says so); the others draw what the backtest stored.
    reports = sorted(p for p in (workspace / "backtests").glob("*.json")
                     if json.loads(p.read_text())["metrics"]["base"])
    old = json.loads(reports[0].read_text())
    assert old["reward_distribution"]["exact"]
    stored = old.pop("reward_distribution")
    reports[0].write_text(json.dumps(old))
    try:
        summary = build_report(workspace, out)
    finally:
        reports[0].write_text(json.dumps({**old, "reward_distribution": stored}))
    pages = check_site(out)
    assert summary.pages == len(pages)
    section = (out / "backtests.html").read_text().split(f'id="bt-{old["id"]}"')[1].split("</section>")[0]
    assert "predates stored distributions: recomputed" in section and 'class="chart"' in section
    assert (out / "backtests.html").read_text().count("as the backtest scored them") == len(reports) - 1
    lineage = (out / "lineage.html").read_text()
    for needle in ("Diagnosis", "Targets", "Expected", "Backtest", "Reverted-Because", "Verification: reverted",
                   'class="hl code"', "Candidates not promoted"):
        assert needle in lineage, needle
    backtests = (out / "backtests.html").read_text()
    assert backtests.count('class="chart"') >= 1 and "delta good" in backtests + "delta bad"
    swe = next(p for p in (out / "rollouts" / "r-none").glob("all-*.html"))
    text = swe.read_text()
    assert "Trajectory, turn by turn" in text and "Grader, per test" in text and 'class="d-add"' in text
    assert "test_shapes.py::test_high" in text and 'class="test passed"' in text
    diag = (out / "diagnostics.html").read_text()
    assert re.search(r'href="rollouts/r\d+/all-\d+\.html#s\d+"', diag), "alerts link to example rollouts"
    # The scripted agent session (report_workspace.agent_session): every call, the refused one marked
    agent = (out / "agent.html").read_text()
    assert "tiny · round 2" in agent and "4 call(s), 1 answered with an error" in agent
    for needle in ("list_rollouts", "show_rollout", "read_harness_file", "def reward", "../store.db",
                   'class="badge reject">refused'):
        assert needle in agent, needle
    assert 'href="agent.html#t-tiny-2"' in lineage

    shots = artifacts_dir / "report"
    shots.mkdir(parents=True, exist_ok=True)
    charts_seen = 0
    with Browser(binary) as browser:
        tab = browser.page()
        for width, height, mobile in ((1280, 800, False), (390, 844, True)):
            tab.viewport(width, height, mobile)
            for page in pages:
                rel = page.relative_to(out).as_posix()
                tab.goto(page.resolve().as_uri())
                assert tab.problems() == [], f"{rel} at {width}px: {tab.problems()}"
                assert tab.eval("document.body.innerText.length") > 100, rel
                # The page fits its width: nothing forces sideways scrolling of the whole page.
                overflow = tab.eval("document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 1, f"{rel} at {width}px overflows by {overflow}px"
                for chart in tab.eval(CHART_DATA):
                    assert chart["w"] > 100 and chart["h"] > 50, f"{rel}: chart frame {chart}"
                    assert chart["drawn"] > 0, f"{rel}: a chart with an empty frame"
                    charts_seen += 1
                if "/" not in rel or rel.endswith(("all-1.html", "index.html")):
                    name = rel.replace("/", "_").removesuffix(".html")
                    tab.screenshot(shots / f"{name}-{width}.png")
    assert charts_seen >= 4  # overview + backtests, at both sizes


@pytest.mark.slow
def test_status_and_report_commands(workspace, tmp_path):
    """In-process through the real typer app (a subprocess per command costs seconds of imports)."""
    from typer.testing import CliRunner

    from evotrainer.cli import main as cli

    def run(*args: str):
        res = CliRunner().invoke(cli.app, list(args), env={"COLUMNS": "160"})
        return res

    status = run("status", "--workdir", str(workspace))
    assert status.exit_code == 0, status.output
    for needle in ("round", "3", "stage", "train", "heldout success", "candidate/0-"):
        assert needle in status.stdout, needle
    out = tmp_path / "cli-site"
    made = run("report", "--workdir", str(workspace), "--out", str(out))
    assert made.exit_code == 0, made.output
    assert str((out / "index.html").resolve()) in made.stdout and "pages" in made.output
    missing = run("report", "--workdir", str(tmp_path / "nowhere"))
    assert missing.exit_code == 2 and "no such workspace" in missing.output
    assert run("status", "--workdir", str(tmp_path / "nowhere")).exit_code == 2
    shown = run("rollouts", "show", "r0-6-00", "--workdir", str(workspace))
    assert shown.exit_code == 0 and "Answer: 4" in shown.stdout
    with Store.open(workspace) as store:
        swe_id = next(store.iter_rollouts(domain="swe")).rollout.id
    trajectory = run("rollouts", "show", swe_id, "--workdir", str(workspace))
    assert trajectory.exit_code == 0, trajectory.output
    for needle in ("turn 1 · system", "turn 3 · assistant", "patch", "grader, per test", "test_shapes.py::test_high"):
        assert needle in trajectory.stdout, needle
    state = json.loads((workspace / "coevolve.json").read_text())
    assert state["round"] == 3
