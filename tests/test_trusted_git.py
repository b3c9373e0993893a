"""Trusted git on real harness repos: planted hooks and config never run, and main moves only by us.

Each test is one attack an escaped harness (or anything that can write into the repo) could make.
The payload of every planted program is `touch <marker>`; no marker may ever appear.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from evotrainer.coevolve import Coevolution, RunState
from evotrainer.config import load_config
from evotrainer.harness.repo import HarnessRepo, HarnessRepoError
from evotrainer.harness.trusted_git import RefMovedError, UnsafeRepoError, safe_env
from evotrainer.paths import CONFIGS_DIR
from evotrainer.workspace import ensure_workspace

HOOKS = ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "pre-merge-commit",
         "post-merge", "post-checkout", "reference-transaction", "post-rewrite", "pre-auto-gc",
         "post-index-change", "fsmonitor-watchman")
REWARD = '''from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {"correct": float(rollout.outcome.success), "partial": 0.5}
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def program(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ntouch {marker}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def ws(tmp_path):
    return ensure_workspace(tmp_path / "work", "math")


def propose(repo: HarnessRepo, slug: str = "partial", text: str = REWARD):
    return repo.propose(1, slug, {"reward.py": text}, diagnosis="dead groups", targets="dead_group_ratio",
                        expected="fewer dead groups")


def every_operation(repo: HarnessRepo) -> None:
    """propose, record_backtest, promote, diff, log, revert: every write path and the reads around them."""
    cand = propose(repo)
    tip = repo.record_backtest(cand.branch, "bt-1")
    merge = repo.promote(cand.branch, "passed", tested=tip)
    repo.diff(f"{merge}^1", merge)
    repo.show(merge)
    repo.log(branches=True)
    repo.revert(merge, "live verification regressed")


def test_planted_hooks_never_run(ws, tmp_path):
    marker = tmp_path / "hook-ran"
    for hook in HOOKS:
        program(ws.harnesses / ".git" / "hooks" / hook, marker)
    every_operation(HarnessRepo(ws.harnesses))
    assert not marker.exists()


@pytest.mark.parametrize("key,value", [
    ("core.hooksPath", "HOOKS"), ("core.fsmonitor", "PROGRAM"), ("diff.external", "PROGRAM"),
    ("filter.evil.clean", "PROGRAM"), ("filter.evil.smudge", "PROGRAM"), ("filter.evil.process", "PROGRAM"),
    ("diff.evil.textconv", "PROGRAM"), ("core.pager", "PROGRAM"), ("core.sshCommand", "PROGRAM"),
    ("gpg.program", "PROGRAM"), ("alias.status", "!PROGRAM"), ("include.path", "INCLUDE"),
    ("core.editor", "PROGRAM"), ("merge.evil.driver", "PROGRAM"), ("core.worktree", "HOOKS"),
])
def test_config_that_runs_programs_is_refused_and_never_runs(ws, tmp_path, key, value):
    marker = tmp_path / "config-ran"
    hooks = tmp_path / "evil-hooks"
    for hook in HOOKS:
        program(hooks / hook, marker)
    exe = program(tmp_path / "evil.sh", marker)
    include = tmp_path / "evil.cfg"
    include.write_text(f"[core]\n\tfsmonitor = {exe}\n")
    value = value.replace("HOOKS", str(hooks)).replace("PROGRAM", str(exe)).replace("INCLUDE", str(include))
    (ws.harnesses / ".git" / "info").mkdir(exist_ok=True)
    (ws.harnesses / ".git" / "info" / "attributes").write_text("* filter=evil diff=evil merge=evil\n")
    repo = HarnessRepo(ws.harnesses)
    cand = propose(repo)
    git(ws.harnesses, "config", key, value)  # planted after our first look
    with pytest.raises(UnsafeRepoError, match=key.rsplit(".", 1)[0].split(".")[0]):
        repo.promote(cand.branch, "passed")
    with pytest.raises(UnsafeRepoError):
        HarnessRepo(ws.harnesses)
    assert not marker.exists()


def test_overrides_hold_even_when_git_reads_the_planted_config(ws, tmp_path):
    """The second layer alone (as if the planted config slipped in after our check): hooks,
    fsmonitor and an external diff named in .git/config stay off under safe_env."""
    marker = tmp_path / "override-ran"
    exe = program(tmp_path / "evil.sh", marker)
    hooks = tmp_path / "evil-hooks"
    for hook in HOOKS:
        program(hooks / hook, marker)
    for key, value in (("core.hooksPath", hooks), ("core.fsmonitor", exe), ("diff.external", exe),
                       ("core.pager", exe)):
        git(ws.harnesses, "config", key, str(value))
    env = safe_env(os.environ)
    (ws.harnesses / "reward.py").write_text(REWARD)
    for args in (["status", "--porcelain"], ["diff", "--no-ext-diff"], ["commit", "-qam", "x"],
                 ["update-ref", "refs/heads/other", "HEAD"], ["checkout", "-q", "other"]):
        subprocess.run(["git", "-C", str(ws.harnesses), *args], env=env, check=True, capture_output=True)
    # Without --no-ext-diff git runs diff.external; ours (`false`) outranks the planted one.
    subprocess.run(["git", "-C", str(ws.harnesses), "log", "-p", "-1", "--ext-diff"], env=env, capture_output=True)
    assert not marker.exists()


def test_main_moved_behind_our_back_stops_with_a_clear_error(ws):
    repo = HarnessRepo(ws.harnesses)
    expected = repo.resolve("main")
    cand = propose(repo)
    git(ws.harnesses, "update-ref", "refs/heads/main", cand.sha)  # a promotion without the gate
    with pytest.raises(RefMovedError) as err:
        repo.sources("main")
    assert (err.value.ref, err.value.expected, err.value.found) == ("refs/heads/main", expected, cand.sha)
    assert expected in str(err.value) and cand.sha in str(err.value)
    with pytest.raises(RefMovedError):  # and a fresh handle (the next command of the run) too
        HarnessRepo(ws.harnesses).promote(cand.branch, "passed")


def test_our_own_moves_are_what_main_is_expected_at(ws):
    repo = HarnessRepo(ws.harnesses)
    cand = propose(repo)
    merge = repo.promote(cand.branch, "passed")
    assert HarnessRepo(ws.harnesses).resolve("main") == merge  # no RefMovedError
    revert = repo.revert(merge, "regressed")
    assert HarnessRepo(ws.harnesses).resolve("main") == revert


def test_a_kill_between_our_merge_and_its_record_is_recovered_and_nothing_else_is(ws):
    """Killed after `git merge` moved main but before the guard recorded it: recover() accepts
    that one commit (ours: a merge naming its Candidate); a ref moved any other way still stops."""
    repo = HarnessRepo(ws.harnesses)
    before = repo.resolve("main")
    merge = repo.promote(propose(repo).branch, "passed")
    repo.guard.record(before)  # the record the kill prevented
    with pytest.raises(RefMovedError):
        HarnessRepo(ws.harnesses).sources("main")
    assert "our own promotion" in " ".join(HarnessRepo(ws.harnesses).recover())
    assert HarnessRepo(ws.harnesses).resolve("main") == merge
    revert = repo.revert(merge, "regressed")
    repo.guard.record(merge)
    assert "our own revert" in " ".join(HarnessRepo(ws.harnesses).recover())
    assert HarnessRepo(ws.harnesses).resolve("main") == revert

    other = propose(repo, slug="other")
    git(ws.harnesses, "update-ref", "refs/heads/main", other.sha)  # not a commit of promote or revert
    recovering = HarnessRepo(ws.harnesses)
    assert recovering.recover() == []
    with pytest.raises(RefMovedError):
        recovering.sources("main")


def test_main_moved_stops_the_next_coevolve_stage(tmp_path):
    config = load_config(CONFIGS_DIR / "math-tiny.yaml", [])
    loop = Coevolution(config, tmp_path / "work")
    expected = loop.repo.resolve("main")
    cand = propose(loop.repo)
    git(loop.ws.harnesses, "update-ref", "refs/heads/main", cand.sha)
    with pytest.raises(RefMovedError, match="refs/heads/main moved outside evotrainer"):
        loop.stage_diagnose(RunState(run="tiny", domain="math", stage="diagnose"))
    assert git(loop.ws.harnesses, "rev-parse", "main") == cand.sha != expected  # we moved nothing back


def test_candidate_repointed_after_its_backtest_is_not_promoted(ws):
    repo = HarnessRepo(ws.harnesses)
    main = repo.resolve("main")
    cand = propose(repo)
    tested = repo.record_backtest(cand.branch, "bt-1")
    evil = propose(repo, "evil", REWARD.replace("0.5", "9.0"))
    git(ws.harnesses, "update-ref", f"refs/heads/{cand.branch}", evil.sha)
    with pytest.raises(RefMovedError) as err:
        repo.promote(cand.branch, "passed", tested=tested)
    assert err.value.expected == tested and err.value.found == evil.sha
    assert repo.resolve("main") == main


def test_the_backtested_commit_itself_promotes(ws):
    """The sha the backtest ran on is the one before record_backtest amended in its trailer."""
    repo = HarnessRepo(ws.harnesses)
    cand = propose(repo)
    repo.record_backtest(cand.branch, "bt-1")
    merge = repo.promote(cand.branch, "passed", tested=cand.sha)
    assert "partial" in repo.sources(merge)["reward.py"]


def test_a_gitfile_repo_is_refused(ws, tmp_path):
    elsewhere = tmp_path / "elsewhere.git"
    os.rename(ws.harnesses / ".git", elsewhere)
    (ws.harnesses / ".git").write_text(f"gitdir: {elsewhere}\n")
    with pytest.raises((UnsafeRepoError, HarnessRepoError)):
        HarnessRepo(ws.harnesses)


def test_the_cli_stops_with_the_moved_ref_named(ws):
    import sys

    repo = HarnessRepo(ws.harnesses)
    expected = repo.resolve("main")
    cand = propose(repo)
    git(ws.harnesses, "update-ref", "refs/heads/main", cand.sha)
    proc = subprocess.run([sys.executable, "-m", "evotrainer", "harness", "log", "--workdir", str(ws.root)],
                          capture_output=True, text=True, timeout=120)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "refs/heads/main moved outside evotrainer" in out
    assert expected in out and cand.sha in out and "Traceback" not in out


def test_a_replace_ref_does_not_swap_mains_files(ws):
    """refs/replace/<main> makes plain git read another commit's tree under main's sha."""
    repo = HarnessRepo(ws.harnesses)
    seed = repo.sources("main")
    cand = propose(repo, "evil", REWARD.replace("0.5", "9.0"))
    git(ws.harnesses, "replace", repo.resolve("main"), cand.sha)
    assert "9.0" in git(ws.harnesses, "show", "main:reward.py")  # plain git is fooled
    repo = HarnessRepo(ws.harnesses)  # a fresh reader (git reads replace refs when it starts)
    assert repo.sources("main") == seed
    assert "9.0" not in repo.diff("main", cand.branch).split("+++")[0]


def test_a_graft_does_not_rewrite_history(ws):
    repo = HarnessRepo(ws.harnesses)
    cand = propose(repo)
    merge = repo.promote(cand.branch, "passed")
    graft = ws.harnesses / ".git" / "info" / "grafts"
    graft.parent.mkdir(exist_ok=True)
    graft.write_text(f"{merge}\n")  # main's merge without parents: the promotion history vanishes
    assert [c.sha for c in repo.log()][:2] == [merge, cand.base]


@pytest.mark.parametrize("text", [
    '[includeIf "gitdir:/"]\n\tpath = INCLUDE\n',
    "[core] fsmonitor = PROGRAM\n",  # git reads a key on the header's line
    "[core]\n\tfilemode = true \\\n\tfsmonitor = PROGRAM\n",  # hidden in a continued value
    '[core "x"]\n\tfsmonitor = PROGRAM\n',
])
def test_config_written_to_slip_past_a_reader_is_refused(ws, tmp_path, text):
    marker = tmp_path / "config-ran"
    exe = program(tmp_path / "evil.sh", marker)
    include = tmp_path / "evil.cfg"
    include.write_text(f"[core]\n\tfsmonitor = {exe}\n")
    config = ws.harnesses / ".git" / "config"
    config.write_text(config.read_text() + text.replace("PROGRAM", str(exe)).replace("INCLUDE", str(include)))
    with pytest.raises(UnsafeRepoError):
        HarnessRepo(ws.harnesses)
    assert not marker.exists()


def test_a_shallow_file_is_refused(ws):
    repo = HarnessRepo(ws.harnesses)
    (ws.harnesses / ".git" / "shallow").write_text(repo.resolve("main") + "\n")
    with pytest.raises(UnsafeRepoError, match="shallow"):
        repo.resolve("main")


def test_a_workspace_made_again_over_an_old_guard_opens(tmp_path):
    """The guard outlives a deleted harness repo; the new repo's creator records its own main."""
    import shutil

    old = ensure_workspace(tmp_path / "work", "math")
    repo = HarnessRepo(old.harnesses)
    repo.promote(propose(repo).branch, "passed")
    shutil.rmtree(old.harnesses)
    new = ensure_workspace(tmp_path / "work", "math")
    assert HarnessRepo(new.harnesses).resolve("main") == git(new.harnesses, "rev-parse", "HEAD")
