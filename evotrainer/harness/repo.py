"""Harness history as git: candidates on branches, promotions as --no-ff merges, undo as reverts.

`main` is the promoted lineage; `git log --first-parent main` reads as the promotion history.
Each intervention is one commit on `candidate/<round>-<slug>` whose message ends in the trailers
`Diagnosis:`, `Targets:`, `Expected:` and, once backtested, `Backtest:`. Candidates are written
with plumbing (a throwaway index, `commit-tree`, `update-ref`), so the working tree stays on main
and harness files are always read from commits, never from whatever is checked out.

Every git command runs as trusted_git says (no hooks, no fsmonitor, no config that runs
programs), and main is checked against the tip our last promote or revert left before every
command: a main that moved otherwise raises RefMovedError.
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import git

from evotrainer.errors import UserError
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import HARNESS_FILES, SPEC_FILE, HarnessError, _needs
from evotrainer.harness.trusted_git import GUARD_FILE, MainGuard, RefMovedError, check_config, safe_env

MAIN = "main"
CANDIDATE_PREFIX = "candidate/"
IDENTITY = ("evotrainer", "evotrainer@localhost")
TRAILER_KEYS = ("Diagnosis", "Targets", "Expected", "Backtest")
SUBJECT_MAX = 72
_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_EXTRA_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.(?:py|yaml|j2|md)")
_BACKTEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# NUL between fields, and (`git log -z`) between records. A commit written with git directly can
# hold any other byte in its message or author (the \x1f and \x1e this once used included), but
# git prints each field only up to a NUL, so no field can hold one: every record is exactly
# _FIELDS fields, whatever its text.
_LOG_FORMAT = "%H%x00%P%x00%an%x00%aI%x00%D%x00%s%x00%b%x00%(trailers:only,unfold)"
_FIELDS = 8
_SHA = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")


class HarnessRepoError(UserError, ValueError):
    """A request the harness repo cannot honour: unknown revision, refused edit, merge conflict..."""


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    parents: tuple[str, ...]
    author: str
    date: datetime
    subject: str
    body: str  # the message between the subject and the trailer block
    trailers: dict[str, str] = field(default_factory=dict)  # a repeated key joins its values with ", "
    refs: tuple[str, ...] = ()  # branches pointing here

    @property
    def short(self) -> str:
        return self.sha[:7]

    @property
    def is_merge(self) -> bool:
        return len(self.parents) > 1


@dataclass(frozen=True)
class Candidate:
    branch: str
    sha: str
    base: str  # sha the candidate branched from
    files: tuple[str, ...]  # files the commit changes


def allowed_file(name: str) -> bool:
    """A harness file, or a new .py/.yaml/.j2/.md file, named plainly at the repo root."""
    return name in HARNESS_FILES or (len(name) <= 100 and _EXTRA_FILE.fullmatch(name) is not None)


def check_edit_path(name: object) -> str:
    if not isinstance(name, str) or not allowed_file(name):
        raise HarnessRepoError(
            f"edit path {name!r} refused: a candidate may only write plain files at the harness repo "
            f"root: {', '.join(HARNESS_FILES)} or new *.py, *.yaml, *.j2, *.md files")
    return name


def _one_line(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise HarnessRepoError(f"{what} must be a non-empty string")
    return " ".join(value.split())


def _trailer(key: str, value: str) -> str:
    # Folded (continuation lines start with a space): readable in `git log`, and
    # `git interpret-trailers --parse` / %(trailers:unfold) give back the one-line value.
    return textwrap.fill(f"{key}: {value}", width=SUBJECT_MAX, subsequent_indent=" ",
                         break_long_words=False, break_on_hyphens=False)


def _paragraph(text: str) -> str:
    return "\n\n".join(textwrap.fill(" ".join(p.split()), width=SUBJECT_MAX)
                       for p in re.split(r"\n\s*\n", text.strip()) if p.strip())


def _subject(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SUBJECT_MAX else text[: SUBJECT_MAX - 3].rstrip() + "..."


def _message(subject: str, body: list[str], trailers: list[tuple[str, str]]) -> str:
    parts = [_subject(subject), *(p for p in body if p)]
    parts.append("\n".join(_trailer(k, v) for k, v in trailers))
    return "\n\n".join(parts) + "\n"


def _line_counts(old: str, new: str) -> str:
    added = removed = 0
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return f"+{added} -{removed}"


class HarnessRepo:
    """One workspace's harness repo (`<workdir>/harnesses/`)."""

    def __init__(self, path: Path | str, guard: Path | str | None = None) -> None:
        """`guard`: the file that records main's tip (default: `harness-refs.json` beside the repo,
        in the workspace, out of reach of anything that can only write inside the repo)."""
        self.path = Path(path)
        try:
            self.repo = git.Repo(self.path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise HarnessRepoError(f"{self.path}: no harness repo here (run `evotrainer init`)") from None
        check_config(self.path)
        self.guard = MainGuard(Path(guard) if guard is not None else self.path.parent / GUARD_FILE)
        # Read (never run) from every config level: commits work on machines without a git
        # identity, and a configured one is respected although git itself reads no global config.
        with self.repo.config_reader() as config:
            name = config.get_value("user", "name", default="") or IDENTITY[0]
            email = config.get_value("user", "email", default="") or IDENTITY[1]
        self._env: dict[str, str] = {
            "GIT_AUTHOR_NAME": str(name), "GIT_AUTHOR_EMAIL": str(email),
            "GIT_COMMITTER_NAME": str(name), "GIT_COMMITTER_EMAIL": str(email)}
        # Also what GitPython's own commands (its cat-file reader of blobs) run with.
        self.repo.git.update_environment(**safe_env())

    def __repr__(self) -> str:
        return f"HarnessRepo({str(self.path)!r})"

    def _run(self, args: list[str], env: Mapping[str, str] | None = None, strip: bool = True) -> str:
        """Every git command of ours: the config checked first, the guarded tip of main checked."""
        check_config(self.path)
        self._check_main()
        return self.repo.git.execute(["git", *args], env={**self._env, **(env or {})},
                                     strip_newline_in_stdout=strip)

    def _git(self, *args: str, env: Mapping[str, str] | None = None, strip: bool = True) -> str:
        try:
            return self._run(list(args), env, strip)
        except git.GitCommandError as exc:
            detail = (exc.stderr or exc.stdout or "").strip().removeprefix("stderr:").strip(" '\n")
            raise HarnessRepoError(f"{self.path}: git {args[0]} failed: {detail}") from None

    def _main_tip(self) -> str | None:
        try:
            return self.repo.git.execute(["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{MAIN}"])
        except git.GitCommandError:
            return None

    def _check_main(self) -> None:
        self.guard.check(self._main_tip())

    def _moved_main(self, before: str) -> str:
        """After our own promote or revert: main's new tip, recorded as the one to expect."""
        tip = self._main_tip()
        if tip is None or tip == before:
            raise HarnessRepoError(f"{self.path}: main did not move")
        self.guard.record(tip)
        return tip

    # ------------------------------------------------------------ reading

    def resolve(self, rev: str) -> str:
        """The full sha of a commit-ish; HarnessRepoError naming the branches for an unknown one."""
        if not isinstance(rev, str) or not rev or rev.startswith("-") or "\n" in rev:
            raise HarnessRepoError(f"{self.path}: bad revision {rev!r}")
        try:
            return self._run(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"])
        except git.GitCommandError:
            branches = ", ".join([MAIN, *self.candidates()]) if self._has(MAIN) else "none"
            raise HarnessRepoError(
                f"{self.path}: unknown revision {rev!r} (branches: {branches})") from None

    def _has(self, branch: str) -> bool:
        try:
            self._run(["rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"])
            return True
        except git.GitCommandError:
            return False

    def sources(self, rev: str = MAIN) -> dict[str, str]:
        """The texts of the harness files (and extra root files) at a commit, read from its tree."""
        sha = self.resolve(rev)
        out = {}
        for blob in self.repo.commit(sha).tree.blobs:
            if blob.mode not in (0o100644, 0o100755) or not allowed_file(blob.name):
                continue
            try:
                out[blob.name] = blob.data_stream.read().decode("utf-8")
            except UnicodeDecodeError:
                raise HarnessRepoError(f"{blob.name}: not UTF-8 text at {sha[:12]}") from None
        return out

    def load(self, rev: str = MAIN) -> IsolatedHarness:
        """The harness at a commit, its code run only in a sandbox worker (harness/isolated.py);
        its `version` is the commit's full sha."""
        sha = self.resolve(rev)
        sources = self.sources(sha)
        for filename in HARNESS_FILES:
            if filename not in sources:
                needs = "GRPO knobs and reward weights" if filename == SPEC_FILE else _needs(filename)
                raise HarnessError(f"{filename}: file not found at {rev} ({sha[:12]}) in {self.path} ({needs})")
        return IsolatedHarness(sources, self.path, version=sha)

    def log(self, first_parent: bool = True, rev: str = MAIN, *, branches: bool = False,
            limit: int | None = None) -> list[CommitInfo]:
        """Newest first. Default: main's promotion history; `branches=True`: every branch, full."""
        args = ["log", "-z", f"--format={_LOG_FORMAT}", "--decorate-refs=refs/heads/", "--topo-order"]
        if first_parent and not branches:
            args.append("--first-parent")
        if limit is not None:
            args.append(f"-n{int(limit)}")
        args += ["--branches"] if branches else [self.resolve(rev)]
        return _parse_log(self._git(*args, strip=False), self.path)

    def show(self, rev: str) -> tuple[CommitInfo, str]:
        """A commit and its unified diff against its first parent (what a promotion did to main)."""
        sha = self.resolve(rev)
        info = self.log(rev=sha, limit=1)[0]
        if info.parents:
            return info, self.diff(info.parents[0], sha)
        return info, self._git("diff-tree", "-p", "--root", "--no-commit-id", "--no-color", "--no-ext-diff",
                               "--no-textconv", sha, strip=False)

    def diff(self, a: str, b: str) -> str:
        return self._git("diff", "--no-color", "--no-ext-diff", "--no-textconv", self.resolve(a), self.resolve(b),
                         strip=False)

    def candidates(self) -> list[str]:
        """Candidate branches, in round order."""
        out = self._git("for-each-ref", "--format=%(refname:short)", f"refs/heads/{CANDIDATE_PREFIX}")
        names = [n for n in out.splitlines() if n]

        def order(name: str) -> tuple[int, str]:
            head = name.removeprefix(CANDIDATE_PREFIX).split("-", 1)[0]
            return (int(head) if head.isdigit() else -1, name)

        return sorted(names, key=order)

    # ------------------------------------------------------------ writing

    def propose(self, round: int, slug: str, edits: Mapping[str, str], *, diagnosis: str,
                targets: str, expected: str, base: str = MAIN, subject: str | None = None,
                notes: str = "") -> Candidate:
        """Commit `edits` ({filename: new text}) as one commit on a new `candidate/<round>-<slug>`
        branch from `base`. Main's working tree and index are not touched."""
        if isinstance(round, bool) or not isinstance(round, int) or round < 0:
            raise HarnessRepoError(f"round must be an integer >= 0, got {round!r}")
        if not isinstance(slug, str) or len(slug) > 48 or not _SLUG.fullmatch(slug):
            raise HarnessRepoError(f"slug {slug!r} must be lowercase words joined by '-' (at most 48 chars)")
        branch = f"{CANDIDATE_PREFIX}{round}-{slug}"
        if self._has(branch):
            raise HarnessRepoError(f"{branch} already exists; pick another slug")
        if not edits:
            raise HarnessRepoError("a candidate needs at least one edit")
        for name, text in edits.items():
            check_edit_path(name)
            if not isinstance(text, str):
                raise HarnessRepoError(f"edit of {name}: new text must be a str, got {type(text).__name__}")
        trailers = [("Diagnosis", _one_line(diagnosis, "diagnosis")),
                    ("Targets", _one_line(targets, "targets")),
                    ("Expected", _one_line(expected, "expected"))]
        base_sha = self.resolve(base)
        tree = self.repo.commit(base_sha).tree
        for name in edits:
            if name in tree and tree[name].type != "blob":
                raise HarnessRepoError(f"edit path {name!r} refused: it is a {tree[name].type} at {base}")
        old = self.sources(base_sha)
        changed = {n: t for n, t in sorted(edits.items()) if old.get(n) != t}
        if not changed:
            raise HarnessRepoError(f"the edits change nothing at {base} ({base_sha[:7]})")
        stats = ", ".join(f"{n} ({_line_counts(old.get(n, ''), t)}{', new' if n not in old else ''})"
                          for n, t in changed.items())
        body = ["\n".join(textwrap.fill(line, width=SUBJECT_MAX) for line in (
                    f"Candidate {round}-{slug}, branched from {base} at {base_sha[:7]}.", f"Changes {stats}.")),
                _paragraph(notes) if notes else ""]
        title = subject or f"{slug.replace('-', ' ').capitalize()} (round {round})"
        if "\n" in title.strip():
            raise HarnessRepoError("subject must be one line")
        message = _message(title, body, trailers)
        with tempfile.TemporaryDirectory(prefix="evotrainer-propose-") as tmp:
            env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
            self._git("read-tree", base_sha, env=env)
            for name, text in changed.items():
                blob_file = Path(tmp, "blob")
                blob_file.write_bytes(text.encode("utf-8"))
                blob = self._git("hash-object", "-w", "--no-filters", str(blob_file))
                self._git("update-index", "--add", "--cacheinfo", f"100644,{blob},{name}", env=env)
            tree_sha = self._git("write-tree", env=env)
            sha = self._commit_tree(tree_sha, [base_sha], message, tmp)
        self._git("update-ref", "-m", f"propose {branch}", f"refs/heads/{branch}", sha, "0" * 40)
        return Candidate(branch, sha, base_sha, tuple(changed))

    def _commit_tree(self, tree: str, parents: list[str], message: str, tmp: str,
                     env: Mapping[str, str] | None = None) -> str:
        msg_file = Path(tmp, "message")
        msg_file.write_text(message, encoding="utf-8")
        parent_args = [a for p in parents for a in ("-p", p)]
        return self._git("commit-tree", tree, *parent_args, "-F", str(msg_file), env=env)

    def _candidate_tip(self, branch: str) -> str:
        if not isinstance(branch, str) or not branch.startswith(CANDIDATE_PREFIX) or not self._has(branch):
            raise HarnessRepoError(f"{branch!r} is not a candidate branch (have: {', '.join(self.candidates()) or 'none'})")
        return self.resolve(f"refs/heads/{branch}")

    def is_promoted(self, rev: str) -> bool:
        """Whether `rev` is in main's history (a promoted candidate's tip is)."""
        try:
            self._run(["merge-base", "--is-ancestor", self.resolve(rev), self.resolve(MAIN)])
            return True
        except git.GitCommandError:
            return False

    def record_backtest(self, branch: str, backtest_id: str) -> str:
        """Amend the candidate's commit so it carries `Backtest: <id>`; return the new sha.

        An amend (not a new commit) keeps one commit per intervention, with all its trailers,
        in `git log -p`. The tree is unchanged, so the backtest holds for the new sha too; the
        commit that was backtested stays reachable at `refs/backtests/<id>` for replays.
        """
        if not isinstance(backtest_id, str) or not _BACKTEST_ID.fullmatch(backtest_id) or ".." in backtest_id:
            raise HarnessRepoError(f"backtest id {backtest_id!r} must be letters, digits, '.', '_' or '-'")
        tip = self._candidate_tip(branch)
        if self.is_promoted(tip):
            raise HarnessRepoError(f"{branch} is already promoted; record its backtest before promoting")
        commit = self.repo.commit(tip)
        trailers = self.log(rev=tip, limit=1)[0].trailers
        ids = [v.strip() for v in trailers.get("Backtest", "").split(",")]
        if backtest_id in ids:
            return tip
        # git refuses a NUL in a message it writes (a hand-made commit may hold one); a message
        # without a trailer block (a hand-made one) gets one of its own, after a blank line
        message = (commit.message.replace("\0", " ").rstrip("\n") + ("\n" if trailers else "\n\n")
                   + _trailer("Backtest", backtest_id) + "\n")
        # A hand-made commit's ident may hold a NUL, which no environment variable can carry.
        author = {"GIT_AUTHOR_NAME": (commit.author.name or IDENTITY[0]).replace("\0", " "),
                  "GIT_AUTHOR_EMAIL": (commit.author.email or IDENTITY[1]).replace("\0", " "),
                  "GIT_AUTHOR_DATE": f"{commit.authored_date} {_tz(commit.author_tz_offset)}"}
        with tempfile.TemporaryDirectory(prefix="evotrainer-amend-") as tmp:
            sha = self._commit_tree(commit.tree.hexsha, [p.hexsha for p in commit.parents], message, tmp, author)
        self._git("update-ref", f"refs/backtests/{backtest_id}", tip)
        self._git("update-ref", "-m", f"backtest {backtest_id}", f"refs/heads/{branch}", sha, tip)
        return sha

    def _require_main_checked_out(self, action: str) -> None:
        try:
            head = self.repo.active_branch.name
        except TypeError:  # detached HEAD
            head = None
        if head != MAIN:
            raise HarnessRepoError(f"{self.path}: {action} needs main checked out (HEAD is {head or 'detached'})")
        dirty = self._git("status", "--porcelain", "--untracked-files=no")
        if dirty:
            raise HarnessRepoError(f"{self.path}: {action} needs a clean working tree; "
                                   f"uncommitted changes:\n{dirty}")

    def promotion_of(self, branch: str) -> str | None:
        """The merge commit on main that promoted `branch`, or None."""
        return next((c.sha for c in self.log(first_parent=True)
                     if c.is_merge and c.trailers.get("Candidate") == branch), None)

    def revert_of(self, sha: str) -> str | None:
        """The commit on main that reverted commit `sha`, or None."""
        return next((c.sha for c in self.log(first_parent=True) if c.trailers.get("Reverts") == sha), None)

    def recover(self) -> list[str]:
        """Clear what a process killed in the middle of a git command left in the repo (a stale
        index lock, a merge or revert in progress, a half-updated working tree), so the next
        command starts from main's last commit. Only for a repo no other process is using; a
        dirty working tree with no sign of a killed git command is a person's, and stays."""
        done = []
        adopted = self._adopt_unrecorded_move()
        if adopted:
            done.append(adopted)
        lock = Path(self.repo.git_dir) / "index.lock"
        if lock.exists():
            lock.unlink()
            done.append("removed a stale index.lock")
        for head, what in (("MERGE_HEAD", "merge"), ("REVERT_HEAD", "revert")):
            if (Path(self.repo.git_dir) / head).exists():
                self._git(what, "--abort")
                done.append(f"aborted an unfinished {what}")
        if done and self._has(MAIN) and self._git("status", "--porcelain", "--untracked-files=no"):
            self._git("reset", "--hard", "--quiet", MAIN)
            done.append("reset a half-updated working tree to main")
        return done

    def _adopt_unrecorded_move(self) -> str | None:
        """A kill between our own merge or revert and recording main's new tip leaves the guard
        one commit behind. Accept exactly that: one commit on top of the recorded tip, made by
        promote (a merge naming its Candidate) or revert (naming what it Reverts)."""
        expected, tip = self.guard.expected(), self._main_tip()
        if expected is None or tip is None or tip == expected:
            return None
        commit = self.repo.commit(tip)
        first_parent = commit.parents[0].hexsha if commit.parents else None
        kind = ("promotion" if len(commit.parents) == 2 and re.search(r"^Candidate: ", commit.message, re.M)
                else "revert" if re.search(r"^Reverts: ", commit.message, re.M) else None)
        if first_parent != expected or kind is None:
            return None  # not ours: the next git command stops with RefMovedError
        self.guard.record(tip)
        return f"main at {tip[:7]} is our own {kind}, made just before a kill: recorded"

    def promote(self, branch: str, reason: str, tested: str | None = None) -> str:
        """`git merge --no-ff` the candidate into main; the message repeats its trailers.

        `tested`: the sha the gate's backtest ran on. The branch's tip must be that commit, or
        the one `record_backtest` amended from it (same tree, same parents); a branch re-pointed
        since raises RefMovedError. The sha checked is the sha merged, whatever the ref does next.
        """
        reason = _one_line(reason, "reason")
        tip = self._candidate_tip(branch)
        if tested is not None and not self._same_change(tip, tested):
            raise RefMovedError(f"refs/heads/{branch}", tested, tip, self.guard.file)
        if self.is_promoted(tip):
            raise HarnessRepoError(f"{branch} ({tip[:7]}) is already in main")
        self._require_main_checked_out("promote")
        info = self.log(rev=tip, limit=1)[0]
        trailers = [("Candidate", branch)] + [(k, info.trailers[k]) for k in TRAILER_KEYS if k in info.trailers]
        body = [_paragraph(reason), _paragraph(f'Merges {branch} ({tip[:7]}, "{info.subject}") into main.')]
        message = _message(f"Promote {branch}", body, trailers)
        with tempfile.TemporaryDirectory(prefix="evotrainer-promote-") as tmp:
            msg_file = Path(tmp, "message")
            msg_file.write_text(message, encoding="utf-8")
            try:
                before = self.resolve(MAIN)
                self._run(["merge", "--no-ff", "--no-edit", "--no-verify", "--quiet", "-F", str(msg_file), tip])
            except git.GitCommandError as exc:
                conflicts = self._git("diff", "--name-only", "--diff-filter=U").split()
                if conflicts:
                    self._git("merge", "--abort")
                    raise HarnessRepoError(f"{branch} does not merge cleanly into main "
                                           f"(conflicts in {', '.join(conflicts)})") from None
                raise HarnessRepoError(f"{self.path}: merging {branch} failed: {(exc.stderr or '').strip()}") from None
        return self._moved_main(before)

    def _same_change(self, tip: str, tested: str) -> bool:
        try:
            tested = self.resolve(tested)
        except HarnessRepoError:
            return False
        if tip == tested:
            return True
        shape = lambda sha: self._git("show", "-s", "--format=%T %P", sha)  # noqa: E731
        return shape(tip) == shape(tested)

    def revert(self, merge_sha: str, why: str) -> str:
        """Undo a promotion with a `git revert -m 1` commit on main whose message says why."""
        why = _one_line(why, "why")
        sha = self.resolve(merge_sha)
        if not self.is_promoted(sha):
            raise HarnessRepoError(f"{sha[:7]} is not in main's history")
        for c in self.log(first_parent=True):
            if c.trailers.get("Reverts") == sha:
                raise HarnessRepoError(f"{sha[:7]} is already reverted by {c.short}")
        self._require_main_checked_out("revert")
        info = self.log(rev=sha, limit=1)[0]
        candidate = info.trailers.get("Candidate")
        subject = f"Revert promotion of {candidate}" if candidate else f'Revert "{info.subject}"'
        what = f"which promoted {candidate}" if candidate else f'"{info.subject}"'
        body = [_paragraph(f"This reverts commit {sha[:12]}, {what}."), _paragraph(why)]
        trailers = [("Reverts", sha)] + ([("Candidate", candidate)] if candidate else [])
        trailers.append(("Reverted-Because", why))
        message = _message(subject, body, trailers)
        mainline = ["-m", "1"] if info.is_merge else []
        before = self.resolve(MAIN)
        try:
            self._run(["revert", "--no-commit", *mainline, sha])
        except git.GitCommandError:
            self._git("revert", "--abort")
            raise HarnessRepoError(f"reverting {sha[:7]} conflicts with later changes on main") from None
        if not self._git("diff", "--cached", "--name-only"):
            self._git("revert", "--abort")
            raise HarnessRepoError(f"reverting {sha[:7]} changes nothing on main")
        with tempfile.TemporaryDirectory(prefix="evotrainer-revert-") as tmp:
            msg_file = Path(tmp, "message")
            msg_file.write_text(message, encoding="utf-8")
            self._git("commit", "--quiet", "--no-verify", "-F", str(msg_file))
        return self._moved_main(before)


def _tz(offset_seconds_west: int) -> str:
    east = -offset_seconds_west
    sign = "+" if east >= 0 else "-"
    return f"{sign}{abs(east) // 3600:02d}{abs(east) % 3600 // 60:02d}"


def _parse_log(text: str, where: Path) -> list[CommitInfo]:
    """`git log -z --format=_LOG_FORMAT` output: _FIELDS NUL-separated fields per record."""
    fields = text.split("\0")
    if len(fields) % _FIELDS == 1 and not fields[-1]:  # a final separator, or no output at all
        fields.pop()
    if len(fields) % _FIELDS or not all(_SHA.fullmatch(sha) for sha in fields[::_FIELDS]):
        raise HarnessRepoError(f"{where}: git log printed records this reader does not understand")
    return [_parse_record(fields[i:i + _FIELDS]) for i in range(0, len(fields), _FIELDS)]


def _date(text: str) -> datetime:
    """The author date; the epoch where git could not read one (a hand-made commit's ident)."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return datetime.fromtimestamp(0, timezone.utc)


def _parse_record(record: list[str]) -> CommitInfo:
    sha, parents, author, date, refs, subject, body, trailer_text = record
    trailers: dict[str, str] = {}
    for line in trailer_text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            key, value = key.strip(), value.strip()
            trailers[key] = f"{trailers[key]}, {value}" if key in trailers else value
    paragraphs = re.split(r"\n\s*\n", body.strip())
    if trailers and paragraphs:
        paragraphs = paragraphs[:-1]  # git reads the trailer block from the last paragraph
    names = tuple(r.removeprefix("HEAD -> ") for r in refs.split(", ") if r and r != "HEAD")
    return CommitInfo(sha=sha, parents=tuple(parents.split()), author=author,
                      date=_date(date), subject=subject,
                      body="\n\n".join(paragraphs).strip(), trailers=trailers, refs=names)
