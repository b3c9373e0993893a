"""The workspace and the harness history as git: real repos in tmp_path, read back with plain git."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import git
import pytest
from factories import make_rollout
from typer.testing import CliRunner

from evotrainer.api import Rollout
from evotrainer.cli.harness import app as harness_app
from evotrainer.cli.main import app as main_app
from evotrainer.domains import DomainError
from evotrainer.harness import HARNESS_FILES, HarnessError
from evotrainer.harness.loader import read_sources
from evotrainer.harness.repo import HarnessRepo, HarnessRepoError
from evotrainer.paths import HARNESSES_DIR
from evotrainer.workspace import Workspace, WorkspaceError, ensure_workspace

SEED = HARNESSES_DIR / "math"
DIAGNOSIS = ("62% of groups have zero reward variance: the policy rarely gets the answer right and "
             "the format component is all-or-nothing, so most groups carry no GRPO signal.")
PARTIAL_CREDIT = '''"""Math reward: correctness plus partial credit for a well-formed answer line."""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {
        "correct": 1.0 if rollout.outcome.success else 0.0,
        "format": 1.0 if "answer_marker" in rollout.outcome.flags else 0.0,
        "partial": 0.5 if rollout.outcome.kind == "wrong" else 0.0,
    }
'''


def git_out(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def rollout(success: bool, kind: str = "ok") -> Rollout:
    return make_rollout("r0", task_id="t", prompt="1+1?", completion="Answer: 2", success=success, kind=kind,
                        flags=("answer_marker",))


@pytest.fixture
def ws(tmp_path) -> Workspace:
    return ensure_workspace(tmp_path / "work", "math")


@pytest.fixture
def repo(ws) -> HarnessRepo:
    return HarnessRepo(ws.harnesses)


def propose(repo: HarnessRepo, round: int = 1, slug: str = "partial-credit", **kw):
    kw.setdefault("edits", {"reward.py": PARTIAL_CREDIT})
    return repo.propose(round, slug, kw.pop("edits"), diagnosis=kw.pop("diagnosis", DIAGNOSIS),
                        targets=kw.pop("targets", "dead_group_ratio"),
                        expected=kw.pop("expected", "dead_group_ratio falls below 0.4, no new ordering violations"),
                        **kw)


def parse_trailers(repo: Path, rev: str) -> dict[str, str]:
    """What git itself reads as the commit's trailers."""
    message = git_out(repo, "log", "-1", "--format=%B", rev)
    parsed = subprocess.run(["git", "interpret-trailers", "--parse"], input=message, check=True,
                            capture_output=True, text=True).stdout
    return dict(line.split(": ", 1) for line in parsed.splitlines())


# ---------------------------------------------------------------- workspace


def test_workspace_is_a_seeded_git_repo_with_files_at_its_root(ws):
    assert ws.skills.is_dir() and ws.backtests.is_dir()
    assert ws.store_path == ws.root / "store.db" and ws.adapters == ws.root / "adapters"
    assert ws.domain == "math"
    tracked = git_out(ws.harnesses, "ls-files").split()
    assert set(HARNESS_FILES) <= set(tracked)
    assert all("/" not in name for name in tracked)
    assert git_out(ws.harnesses, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    log = git_out(ws.harnesses, "log", "--format=%an|%s", "main").splitlines()
    assert log == ["evotrainer|Seed harness for math"]
    for name, text in read_sources(SEED).items():
        assert (ws.harnesses / name).read_text() == text
    assert git_out(ws.harnesses, "status", "--porcelain") == ""
    assert not [p for p in ws.root.iterdir() if p.name.startswith(".harnesses-")]  # no staging left


def test_ensure_workspace_is_idempotent_and_keeps_history(ws, repo):
    cand = propose(repo)
    repo.promote(cand.branch, "passed the gate")
    head = repo.resolve("main")
    again = ensure_workspace(ws.root, "math")
    assert again.root == ws.root and HarnessRepo(again.harnesses).resolve("main") == head
    assert [c.subject for c in repo.log()][-1] == "Seed harness for math"


def test_workspace_for_another_domain_is_refused(ws):
    with pytest.raises(WorkspaceError, match=r"domain 'math', not 'code'"):
        ensure_workspace(ws.root, "code")


def test_unknown_domain_and_non_repo_folder_are_refused(tmp_path):
    with pytest.raises(DomainError, match="unknown domain 'chess'; known: .*math"):
        ensure_workspace(tmp_path / "a", "chess")
    with pytest.raises(WorkspaceError, match="no seed harness for domain 'math' at .*nope.*shipped domains: .*math"):
        ensure_workspace(tmp_path / "a", "math", seed=tmp_path / "nope")
    assert not (tmp_path / "a").exists()
    (tmp_path / "b" / "harnesses").mkdir(parents=True)
    (tmp_path / "b" / "harnesses" / "notes.txt").write_text("mine")
    with pytest.raises(WorkspaceError, match="not empty and is not a git repo"):
        ensure_workspace(tmp_path / "b", "math")


def test_workspace_from_a_custom_seed(tmp_path):
    seed = tmp_path / "seed"
    seed.mkdir()
    for name, text in read_sources(SEED).items():
        (seed / name).write_text(text)
    (seed / "NOTES.md").write_text("why this seed\n")
    (seed / "sub").mkdir()
    (seed / "sub" / "x.py").write_text("")
    ws = ensure_workspace(tmp_path / "work", "math", seed=seed)
    assert sorted(git_out(ws.harnesses, "ls-files").split()) == sorted([*HARNESS_FILES, "NOTES.md"])


# ---------------------------------------------------------------- reading commits


def test_sources_and_load_read_a_commit_not_the_working_tree(ws, repo):
    seed_sha = repo.resolve("main")
    (ws.harnesses / "reward.py").write_text("this is not python(")  # a dirty working tree is ignored
    sources = repo.sources("main")
    assert sources == read_sources(SEED)
    harness = repo.load()
    assert harness.version == seed_sha and re.fullmatch(r"[0-9a-f]{40}", harness.version)
    assert harness.reward(rollout(True)) == {"correct": 1.0, "format": 1.0}

    cand = propose(repo)
    assert repo.sources(cand.branch)["reward.py"] == PARTIAL_CREDIT
    assert repo.sources(seed_sha)["reward.py"] == read_sources(SEED)["reward.py"]
    loaded = repo.load(cand.sha[:10])
    assert loaded.version == cand.sha
    assert loaded.reward(rollout(False, "wrong"))["partial"] == 0.5


def test_resolve_names_the_branches_for_an_unknown_rev(repo):
    propose(repo)
    with pytest.raises(HarnessRepoError, match=r"unknown revision 'nope' \(branches: main, candidate/1-partial-credit\)"):
        repo.resolve("nope")
    with pytest.raises(HarnessRepoError, match="bad revision"):
        repo.resolve("--all")


def test_load_of_a_commit_missing_a_harness_file_is_a_harness_error(ws, repo):
    git_out(ws.harnesses, "rm", "-q", "filters.py")
    git_out(ws.harnesses, "commit", "-q", "-m", "Drop filters")
    (ws.root / "harness-refs.json").unlink()  # the user accepts their own commit on main, as RefMovedError says
    with pytest.raises(HarnessError, match=r"filters.py: file not found at main"):
        repo.load()


def test_not_a_repo(tmp_path):
    with pytest.raises(HarnessRepoError, match="no harness repo here"):
        HarnessRepo(tmp_path)


# ---------------------------------------------------------------- candidates


def test_propose_writes_one_commit_with_trailers_and_leaves_main_alone(ws, repo):
    main_before = repo.resolve("main")
    status_before = git_out(ws.harnesses, "status", "--porcelain")
    index_before = (ws.harnesses / ".git" / "index").read_bytes()
    yaml_text = repo.sources()["harness.yaml"].replace("format: 0.1", "format: 0.3")
    cand = propose(repo, 3, "format-partial-credit", edits={"reward.py": PARTIAL_CREDIT, "harness.yaml": yaml_text})

    assert cand.branch == "candidate/3-format-partial-credit"
    assert cand.base == main_before and cand.files == ("harness.yaml", "reward.py")
    assert git_out(ws.harnesses, "rev-list", "--count", f"main..{cand.branch}").strip() == "1"
    assert git_out(ws.harnesses, "rev-parse", f"{cand.branch}^").strip() == main_before
    changed = git_out(ws.harnesses, "diff", "--name-only", "main", cand.branch).split()
    assert changed == ["harness.yaml", "reward.py"]
    # main, HEAD, the index and the checked-out files are untouched
    assert repo.resolve("main") == main_before
    assert git_out(ws.harnesses, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git_out(ws.harnesses, "status", "--porcelain") == status_before == ""
    assert (ws.harnesses / ".git" / "index").read_bytes() == index_before
    assert (ws.harnesses / "reward.py").read_text() == read_sources(SEED)["reward.py"]

    trailers = parse_trailers(ws.harnesses, cand.branch)
    assert trailers == {"Diagnosis": DIAGNOSIS, "Targets": "dead_group_ratio",
                        "Expected": "dead_group_ratio falls below 0.4, no new ordering violations"}
    assert repo.log(rev=cand.branch, limit=1)[0].trailers == trailers
    assert repo.candidates() == [cand.branch]


def test_git_log_p_reads_well(ws, repo):
    cand = propose(repo, 2, "partial-credit", notes="Scores a wrong but well-formed answer above an "
                   "unparseable one, so groups of all-wrong answers still rank.")
    repo.record_backtest(cand.branch, "bt-0001")
    repo.promote(cand.branch, "Backtest bt-0001 passed the gate.")
    text = git_out(ws.harnesses, "log", "-p", "--all")
    messages = git_out(ws.harnesses, "log", "--branches", "--format=%B%x00").split("\x00")
    for message in filter(str.strip, messages):
        lines = message.strip("\n").splitlines()
        assert len(lines[0]) <= 72, lines[0]
        assert len(lines) == 1 or lines[1] == "", "subject, then a blank line"
        assert all(len(line) <= 80 for line in lines), message
    candidate = git_out(ws.harnesses, "log", "-1", "--format=%B", cand.branch)
    assert candidate.startswith("Partial credit (round 2)\n\n")
    assert re.search(r"Changes reward\.py \(\+\d+ -\d+\)\.", candidate), candidate
    assert "\nDiagnosis: 62% of groups" in candidate and "\nBacktest: bt-0001\n" in candidate
    assert "+        \"partial\": 0.5" in text  # the diff itself is in `git log -p`


@pytest.mark.parametrize("path", [
    "/etc/passwd", "../reward.py", "sub/reward.py", ".git/config", ".git", "..", ".hidden.py",
    "reward.py/", "notes.txt", "run.sh", "", "a\\b.py", "conftest.py/x",
])
def test_edits_outside_the_harness_root_are_refused(repo, path):
    main = repo.resolve("main")
    with pytest.raises(ValueError, match="refused"):
        propose(repo, edits={path: "x = 1\n"})
    assert repo.candidates() == [] and repo.resolve("main") == main


def test_new_root_files_of_allowed_kinds_are_accepted(repo):
    cand = propose(repo, edits={"helpers.py": "X = 1\n", "notes.md": "# why\n", "extra.yaml": "a: 1\n",
                                "prompt.j2": "{{ question }}\n"})
    assert set(cand.files) == {"helpers.py", "notes.md", "extra.yaml", "prompt.j2"}
    assert repo.sources(cand.sha)["helpers.py"] == "X = 1\n"


def test_bad_proposals_are_refused(repo):
    with pytest.raises(HarnessRepoError, match="change nothing"):
        propose(repo, edits={"reward.py": repo.sources()["reward.py"]})
    with pytest.raises(HarnessRepoError, match="slug"):
        propose(repo, slug="Bad Slug")
    with pytest.raises(HarnessRepoError, match="diagnosis"):
        propose(repo, diagnosis="  ")
    propose(repo)
    with pytest.raises(HarnessRepoError, match="already exists"):
        propose(repo)


def test_record_backtest_amends_the_candidate_and_keeps_the_backtested_commit(ws, repo):
    cand = propose(repo)
    new = repo.record_backtest(cand.branch, "bt-20240501-0001")
    assert new != cand.sha
    assert repo.resolve(cand.branch) == new
    assert git_out(ws.harnesses, "rev-list", "--count", f"main..{cand.branch}").strip() == "1"
    assert git_out(ws.harnesses, "rev-parse", f"{new}^{{tree}}") == git_out(ws.harnesses, "rev-parse", f"{cand.sha}^{{tree}}")
    assert parse_trailers(ws.harnesses, new)["Backtest"] == "bt-20240501-0001"
    assert repo.resolve("refs/backtests/bt-20240501-0001") == cand.sha  # what the backtest ran on
    assert repo.record_backtest(cand.branch, "bt-20240501-0001") == new  # recording twice is a no-op
    with pytest.raises(HarnessRepoError, match="not a candidate branch"):
        repo.record_backtest("main", "bt-x")


# ---------------------------------------------------------------- promote and revert


def test_promote_is_a_no_ff_merge_that_reads_as_the_promotion_history(ws, repo):
    seed = repo.resolve("main")
    cand = propose(repo)
    tip = repo.record_backtest(cand.branch, "bt-7")
    merge = repo.promote(cand.branch, "dead_group_ratio 0.62 -> 0.31 in backtest bt-7; no safety metric worse.")

    assert git_out(ws.harnesses, "rev-parse", f"{merge}^1").strip() == seed
    assert git_out(ws.harnesses, "rev-parse", f"{merge}^2").strip() == tip
    first_parent = git_out(ws.harnesses, "log", "--first-parent", "--format=%s", "main").splitlines()
    assert first_parent == ["Promote candidate/1-partial-credit", "Seed harness for math"]
    trailers = parse_trailers(ws.harnesses, merge)
    assert trailers["Candidate"] == cand.branch and trailers["Backtest"] == "bt-7"
    assert trailers["Diagnosis"] == DIAGNOSIS and trailers["Targets"] == "dead_group_ratio"
    body = git_out(ws.harnesses, "log", "-1", "--format=%b", merge)
    assert "dead_group_ratio 0.62 -> 0.31" in body
    # the working tree follows main, and training would now load the promoted harness
    assert (ws.harnesses / "reward.py").read_text() == PARTIAL_CREDIT
    assert git_out(ws.harnesses, "status", "--porcelain") == ""
    assert repo.load().version == merge
    info = repo.log()[0]
    assert info.is_merge and info.subject == "Promote candidate/1-partial-credit" and "main" in info.refs
    with pytest.raises(HarnessRepoError, match="already in main"):
        repo.promote(cand.branch, "again")


def test_promote_needs_a_clean_main(ws, repo):
    cand = propose(repo)
    (ws.harnesses / "reward.py").write_text("# hand edit\n")
    with pytest.raises(HarnessRepoError, match="clean working tree"):
        repo.promote(cand.branch, "ok")
    git_out(ws.harnesses, "checkout", "-q", "--", "reward.py")
    git_out(ws.harnesses, "checkout", "-q", cand.branch)
    with pytest.raises(HarnessRepoError, match="needs main checked out"):
        repo.promote(cand.branch, "ok")


def test_conflicting_promotion_is_refused_and_main_left_clean(ws, repo):
    a = propose(repo, 1, "a", edits={"reward.py": PARTIAL_CREDIT})
    b = propose(repo, 1, "b", edits={"reward.py": PARTIAL_CREDIT.replace("0.5", "0.25")})
    first = repo.promote(a.branch, "first")
    with pytest.raises(HarnessRepoError, match="conflicts in reward.py"):
        repo.promote(b.branch, "second")
    assert repo.resolve("main") == first
    assert git_out(ws.harnesses, "status", "--porcelain") == ""


def test_revert_restores_the_files_and_says_why(ws, repo):
    seed_sources = repo.sources()
    cand = propose(repo)
    merge = repo.promote(cand.branch, "passed the gate")
    why = "Held-out verified success fell from 0.41 to 0.33 in round 4, beyond the 0.03 noise band."
    revert = repo.revert(merge, why)

    assert git_out(ws.harnesses, "rev-parse", f"{revert}^").strip() == merge
    assert repo.sources("main") == seed_sources
    assert (ws.harnesses / "reward.py").read_text() == seed_sources["reward.py"]
    trailers = parse_trailers(ws.harnesses, revert)
    assert trailers["Reverted-Because"] == why and trailers["Reverts"] == merge
    subjects = git_out(ws.harnesses, "log", "--first-parent", "--format=%s", "main").splitlines()
    assert subjects == ["Revert promotion of candidate/1-partial-credit",
                        "Promote candidate/1-partial-credit", "Seed harness for math"]
    assert repo.diff("main", f"{merge}^1") == ""
    with pytest.raises(HarnessRepoError, match="already reverted"):
        repo.revert(merge, "again")


def test_revert_of_a_commit_outside_main_is_refused(repo):
    cand = propose(repo)
    with pytest.raises(HarnessRepoError, match="not in main's history"):
        repo.revert(cand.sha, "why")


def test_log_show_diff_and_candidates(repo):
    seed = repo.resolve("main")
    a = propose(repo, 2, "a")
    b = propose(repo, 10, "b", edits={"filters.py": repo.sources()["filters.py"] + "\n# b\n"})
    assert repo.candidates() == [a.branch, b.branch]  # round order, not text order
    merge = repo.promote(a.branch, "ok")
    assert [c.sha for c in repo.log()] == [merge, seed]
    everything = {c.sha for c in repo.log(branches=True)}
    assert {merge, seed, a.sha, b.sha} == everything
    info, patch = repo.show(merge)
    assert info.parents == (seed, a.sha) and info.trailers["Candidate"] == a.branch
    assert patch.startswith("diff --git a/reward.py b/reward.py") and '+        "partial": 0.5 if' in patch
    root, root_patch = repo.show(seed)
    assert root.parents == () and "new file mode" in root_patch
    assert "+# b" in repo.diff("main", b.branch)
    assert repo.diff("main", "main") == ""


# ---------------------------------------------------------------- CLI


def test_cli_init_log_show_diff(tmp_path):
    runner = CliRunner()
    work = tmp_path / "work"
    made = runner.invoke(main_app, ["init", "--domain", "math", "--workdir", str(work)])
    assert made.exit_code == 0, made.output
    assert "new math workspace" in made.output and "Seed harness for math" in made.output
    again = runner.invoke(main_app, ["init", "--domain", "math", "--workdir", str(work)])
    assert again.exit_code == 0 and "existing math workspace" in again.output

    repo = HarnessRepo(work / "harnesses")
    cand = propose(repo)
    repo.record_backtest(cand.branch, "bt-42")
    merge = repo.promote(cand.branch, "passed the gate")

    log = runner.invoke(harness_app, ["log", "--workdir", str(work)])
    assert log.exit_code == 0, log.output
    assert "Promote candidate/1-partial-credit" in log.output and "Seed harness for math" in log.output
    assert "Backtest" in log.output and "bt-42" in log.output and "Targets" in log.output
    assert "Partial credit (round 1)" not in log.output  # first parent only
    full = runner.invoke(harness_app, ["log", "--all", "--workdir", str(work)])
    assert "Partial credit (round 1)" in full.output

    show = runner.invoke(harness_app, ["show", merge[:8], "--workdir", str(work)])
    assert show.exit_code == 0, show.output
    assert "passed the gate" in show.output and '+        "partial": 0.5 if' in show.output
    assert "Diagnosis" in show.output

    diff = runner.invoke(harness_app, ["diff", "main~1", "main", "--workdir", str(work)])
    assert diff.exit_code == 0 and "--- a/reward.py" in diff.output
    bad = runner.invoke(harness_app, ["show", "nope", "--workdir", str(work)])
    assert bad.exit_code == 2 and "unknown revision 'nope'" in bad.output
    missing = runner.invoke(harness_app, ["log", "--workdir", str(tmp_path / "none")])
    assert missing.exit_code == 2 and "evotrainer init" in missing.output


def test_commits_work_without_a_git_identity(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    ws = ensure_workspace(tmp_path / "work", "math")
    repo = HarnessRepo(ws.harnesses)
    merge = repo.promote(propose(repo).branch, "ok")
    assert git.Repo(ws.harnesses).commit(merge).author.name == "evotrainer"


# ---------------------------------------------------------------- any byte in a commit message


def _hand_made(repo: HarnessRepo, branch: str, message: bytes, author: bytes = b"A\x1fB") -> str:
    """A commit written with git directly (as an attacker with the repo could), any bytes in it."""
    tree = git_out(repo.path, "rev-parse", "main^{tree}").strip()
    parent = git_out(repo.path, "rev-parse", "main").strip()
    raw = (f"tree {tree}\nparent {parent}\n".encode() + b"author " + author + b" <a@b> 1700000000 +0000\n"
           + b"committer X <x@y> 1700000000 +0000\n\n" + message)
    sha = subprocess.run(["git", "-C", str(repo.path), "hash-object", "-t", "commit", "-w", "--literally", "--stdin"],
                         input=raw, check=True, capture_output=True).stdout.decode().strip()
    git_out(repo.path, "update-ref", f"refs/heads/{branch}", sha)
    return sha


@pytest.mark.parametrize("message, author", [
    (b"sub\x1fject \x1e more\n\nbody \x1e\x1f x\n\nDiagnosis: d\x1f\x1e\n", b"A\x1fB\x1e"),
    (b"cut\x00 after a NUL \x1f\n\nTargets: reward\n", b"A\x00B"),  # git prints up to the NUL
    (b"\x1e\x1e\x1e", b"\x1f"),
    (b"no date", b"broken ident without an email"),
])
def test_separator_bytes_in_a_hand_made_commit_do_not_break_the_log(tmp_path, message, author):
    runner = CliRunner()
    work = tmp_path / "work"
    assert runner.invoke(main_app, ["init", "--domain", "math", "--workdir", str(work)]).exit_code == 0
    repo = HarnessRepo(work / "harnesses")
    honest = propose(repo)
    sha = _hand_made(repo, "candidate/1-evil", message, author)
    log = {c.sha: c for c in repo.log(branches=True)}
    assert sha in log and honest.sha in log and len(log) == len(git_out(repo.path, "rev-list", "--all").split())
    assert log[sha].parents == (repo.resolve("main"),)
    assert "candidate/1-evil" in log[sha].refs
    # the backtest's record of its verdict on the branch, and the CLI's full log, both go on
    recorded = repo.record_backtest("candidate/1-evil", "bt-evil")
    assert repo.log(rev=recorded, limit=1)[0].trailers.get("Backtest", "").endswith("bt-evil")
    full = runner.invoke(harness_app, ["log", "--all", "--workdir", str(work)])
    assert full.exit_code == 0, full.output
    assert "Partial credit (round 1)" in full.output
