"""Synthesize SWE tasks from a real Python repo: inject seeded bugs, keep the ones its tests catch.

1. Baseline, once: collect the test suite's node ids and run it (sandboxed, junit XML).
2. Draw mutation sites in a seeded order (mutate.py), sites in functions the tests name first.
3. For each candidate: run the tests relevant to the mutated function (the test units that name
   it, in the test files that import its module, plus a few controls; the whole relevant files
   when nothing names it) on a copy with the bug applied.
4. Keep it when >= 1 test goes pass -> fail (FAIL_TO_PASS) and >= 1 still passes (PASS_TO_PASS).
   Both lists are capped (any subset of a valid FAIL_TO_PASS is valid): the grader runs them for
   every rollout, so they stay small.
5. Optionally grade each kept task with the real grader (gold must resolve, empty must not).

Simplifications: one bug per task, in one file; the baseline runs once (a flaky test can turn
up in FAIL_TO_PASS; `verify` with the grader catches most); "relevant tests" is a name
heuristic, not coverage.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from evotrainer.errors import UserError
from evotrainer.grade import Grader, is_test_path, make_patch, task_from_dict
from evotrainer.grade.grader import junit_key, parse_junit
from evotrainer.sandbox import run_sandboxed
from evotrainer.tasks import mutate, repos

TEMPLATES = Path(__file__).with_name("templates")
LEVELS = (0, 1, 2)
SKIP_SOURCE_DIRS = frozenset({"docs", "doc", "examples", "example", "benchmarks", "bench", "scripts", "tools"})
SKIP_SOURCE_FILES = frozenset({"setup.py", "conftest.py", "__main__.py", "_version.py", "version.py", "noxfile.py"})


class SynthError(UserError, RuntimeError):
    """The repo's own test suite cannot be the oracle: nothing collected, no clean baseline run,
    no test passing before any mutation."""


@dataclass
class SynthOptions:
    n: int = 10
    seed: int = 0
    levels: tuple[int, ...] = LEVELS
    workers: int = 1
    timeout_s: float = 60.0  # one mutated run
    baseline_timeout_s: float = 600.0
    max_candidates: int = 400  # sites tried before giving up
    max_fail_to_pass: int = 10
    max_pass_to_pass: int = 15
    max_per_function: int = 1  # kept tasks per function: spread the bugs over the code
    controls: int = 3  # extra test units run with every candidate, so PASS_TO_PASS is rarely empty
    include: tuple[str, ...] = ()  # glob patterns of source files to mutate (default: all)
    verify: bool = True  # grade gold (must resolve) and empty (must not) with the real grader
    statement_hook: Callable[[dict], str] | None = None  # e.g. an LLM; gets the template context
    progress: Callable[[str], None] | None = None


@dataclass
class TestRun:
    """Per-test status of one pytest run, by node id, plus failure messages."""

    status: dict[str, str]
    messages: dict[str, str] = field(default_factory=dict)
    timed_out: bool = False  # or killed for its process budget: statuses are incomplete
    returncode: int | None = None
    log: str = ""
    full_stdout: str = ""  # kept only when there is no junit XML (to see where the run died)


# ---------------------------------------------------------------- running pytest in the sandbox


def _pytest_cmd(args: Sequence[str], junit: bool, verbose: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v" if verbose else "-q", "--rootdir", "{repo}"]
    if junit:
        cmd.append("--junitxml={out}/junit.xml")
    return cmd + list(args)


_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # as the grader runs it
_LIMITS = {"mem_mb": Grader.mem_mb, "nproc": Grader.nproc}  # a test that needs more cannot be graded
_STATUS_WORD = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def collect(repo: Path, test_files: Sequence[str], timeout_s: float) -> list[str]:
    """Node ids of the test suite, as pytest names them from the repo root."""
    sb = run_sandboxed(_pytest_cmd(["--collect-only", *test_files], junit=False), src=repo,
                       timeout_s=timeout_s, env_extra=_ENV, **_LIMITS)
    ids = [ln.strip() for ln in sb.stdout.splitlines() if "::" in ln and not ln.startswith(("=", " "))]
    if not ids:
        raise SynthError(f"no tests collected in {repo}:\n{sb.stdout[-2000:]}\n{sb.stderr[-2000:]}")
    return ids


def _messages(xml: bytes) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return out
    for case in root.iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                body = (child.text or "").strip().splitlines()
                text = child.get("message") or (body[-1] if body else "")
                key = (case.get("classname", ""), case.get("name", ""))
                out.setdefault(key, _clip(text or ""))
    return out


def _clip(text: str, lines: int = 3, width: int = 300) -> str:
    kept = [ln.rstrip()[:width] for ln in text.strip().splitlines()[:lines]]
    return "\n".join(ln for ln in kept if ln.strip())


def run_tests(repo: Path, ids: Sequence[str], args: Sequence[str], timeout_s: float,
              files: dict[str, str] | None = None, verbose: bool = False) -> TestRun:
    """Run pytest on `args` (files or node ids) in a sandboxed copy of `repo` (+ `files`) and
    read the status of each of `ids` from the junit XML (missing when absent)."""
    sb = run_sandboxed(_pytest_cmd(args, junit=True, verbose=verbose), src=repo, files=files,
                       timeout_s=timeout_s, env_extra=_ENV, **_LIMITS)
    xml = sb.outputs.get("junit.xml")
    junit = parse_junit(xml) if xml else {}
    messages = _messages(xml) if xml else {}
    status = {i: junit.get(junit_key(i), "missing") for i in ids}
    msgs = {i: messages[junit_key(i)] for i in ids if junit_key(i) in messages}
    return TestRun(status, msgs, sb.timed_out or sb.nproc_exceeded, sb.returncode,
                   sb.stdout[-3000:] + sb.stderr[-2000:], sb.stdout if xml is None else "")


def baseline(repo: Path, ids: Sequence[str], test_files: Sequence[str], timeout_s: float,
             say: Callable[[str], None], retries: int = 5) -> tuple[TestRun, list[str]]:
    """The suite's statuses before any mutation, and the tests deselected for good: a test that
    kills the run (process budget, memory, a hang) is dropped and the suite run again."""
    dropped: list[str] = []
    for _ in range(retries + 1):
        args = [*test_files, *(a for t in dropped for a in ("--deselect", t))]
        run = run_tests(repo, ids, args, timeout_s, verbose=True)
        if not run.timed_out and run.full_stdout == "":
            return run, dropped
        started = [ln.split(" ", 1)[0] for ln in run.full_stdout.splitlines()
                   if "::" in ln and not _STATUS_WORD.search(ln)]
        if not started or started[-1] in dropped:
            break
        dropped.append(started[-1])
        say(f"baseline: {started[-1]} kills the run (limits {_LIMITS}); deselected")
    raise SynthError(f"{repo}: the baseline test run did not finish:\n{run.log}")


# ---------------------------------------------------------------- which tests are relevant


def discover(repo: Path, include: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """(source files to mutate, test files), repo-relative."""
    from fnmatch import fnmatch

    sources, tests = [], []
    for rel in repos.source_files(repo):
        if not rel.endswith(".py"):
            continue
        p = PurePosixPath(rel)
        if is_test_path(rel):
            if fnmatch(p.name, "test_*.py") or fnmatch(p.name, "*_test.py"):
                tests.append(rel)
            continue
        if p.name in SKIP_SOURCE_FILES or any(part in SKIP_SOURCE_DIRS for part in p.parts[:-1]):
            continue
        if include and not any(fnmatch(rel, pat) for pat in include):
            continue
        sources.append(rel)
    return sources, tests


def _module_name(rel: str) -> str:
    parts = list(PurePosixPath(rel).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass
class _TestIndex:
    """Test units (a class or a top-level test function) and the identifiers each one uses."""

    ids: list[str]  # every collected node id
    units: dict[str, list[str]]  # unit id ("file::Class" / "file::test") -> node ids
    names: dict[str, set[str]]  # unit id -> identifiers in its source
    file_text: dict[str, str]
    dropped: list[str] = field(default_factory=list)  # never run: they break the sandbox's limits

    @classmethod
    def build(cls, repo: Path, ids: list[str], dropped: Sequence[str] = ()) -> _TestIndex:
        units: dict[str, list[str]] = {}
        for i in ids:
            parts = i.split("::")
            unit = "::".join(parts[:2]).split("[", 1)[0]
            units.setdefault(unit, []).append(i)
        names: dict[str, set[str]] = {}
        texts: dict[str, str] = {}
        for file in sorted({i.split("::", 1)[0] for i in ids}):
            try:
                texts[file] = (repo / file).read_text(encoding="utf-8")
                tree = ast.parse(texts[file])
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                continue
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                    found |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                    names[f"{file}::{node.name}"] = found
        return cls(ids, units, names, texts, list(dropped))

    def relevant_files(self, source: str) -> list[str]:
        module = _module_name(source)
        stem = module.rsplit(".", 1)[-1]
        out = []
        for file, text in self.file_text.items():
            test_stem = PurePosixPath(file).stem.removeprefix("test_").removesuffix("_test")
            if module in text or test_stem == stem or (stem and stem in test_stem.split("_")):
                out.append(file)
        return out or sorted(self.file_text)

    def select(self, mutation: mutate.Site, files: list[str], controls: int) -> tuple[list[str], list[str]]:
        """(pytest args, node ids they run) for one candidate."""
        name = mutation.function.split(".")[-1]
        if name.startswith("__") and "." in mutation.function:
            name = mutation.function.split(".")[-2]
        in_files = [u for u in self.units if u.split("::", 1)[0] in files]
        named = [u for u in in_files if name in self.names.get(u, ())]
        deselect = [a for t in self.dropped for a in ("--deselect", t)]
        if not named:
            return list(files) + deselect, [i for u in in_files for i in self.units[u]]
        others = [u for u in in_files if u not in named]
        rng = random.Random(f"controls:{mutation.path}:{mutation.index}")
        chosen = named + rng.sample(others, min(controls, len(others)))
        return chosen + deselect, [i for u in chosen for i in self.units[u]]

    def mentions(self, function: str) -> bool:
        name = function.split(".")[-1]
        return any(name in found for found in self.names.values())


# ---------------------------------------------------------------- one candidate


@dataclass
class Candidate:
    mutation: mutate.Mutation
    site: mutate.Site
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    messages: dict[str, str]


def _evaluate(repo: Path, index: _TestIndex, baseline: dict[str, str], source: str, site: mutate.Site,
              opts: SynthOptions) -> Candidate | None:
    m = mutate.apply(source, site)
    if m is None:
        return None
    files = index.relevant_files(site.path)
    args, ids = index.select(site, files, opts.controls)
    run = run_tests(repo, ids, args, opts.timeout_s, files={site.path: m.mutated})
    if run.timed_out:
        return None
    was_passing = [i for i in ids if baseline.get(i) == "passed"]
    f2p = sorted(i for i in was_passing if run.status[i] != "passed")
    p2p = sorted(i for i in was_passing if run.status[i] == "passed")
    if not f2p or not p2p:
        return None
    return Candidate(m, site, _cap(f2p, opts.max_fail_to_pass, site), _cap_p2p(p2p, f2p, opts.max_pass_to_pass),
                     run.messages)


def _cap(ids: list[str], k: int, site: mutate.Site) -> list[str]:
    if len(ids) <= k:
        return ids
    return sorted(random.Random(f"cap:{site.path}:{site.index}").sample(ids, k))


def _cap_p2p(p2p: list[str], f2p: list[str], k: int) -> list[str]:
    """Prefer tests of the same units as the failing ones (the closest regression check)."""
    units = {"::".join(i.split("::")[:2]).split("[", 1)[0] for i in f2p}
    near = [i for i in p2p if "::".join(i.split("::")[:2]).split("[", 1)[0] in units]
    far = [i for i in p2p if i not in set(near)]
    return sorted((near + far)[:k])


# ---------------------------------------------------------------- statements and records


def _template_env() -> Environment:
    return Environment(loader=FileSystemLoader(str(TEMPLATES)), undefined=StrictUndefined,
                       keep_trailing_newline=True, trim_blocks=False)


def problem_statement(context: dict[str, Any], hook: Callable[[dict], str] | None = None) -> str:
    """The statement from the template, or from `hook(context)` when given (template on failure)."""
    if hook is not None:
        try:
            text = hook(dict(context))
            if isinstance(text, str) and text.strip():
                return text.strip() + "\n"
        except Exception:
            pass
    return _template_env().get_template("problem.md.j2").render(**context).strip() + "\n"


def _statement_context(c: Candidate, level: int, repo_name: str, shown: int = 3) -> dict[str, Any]:
    failing = [{"id": i, "message": c.messages.get(i, "")} for i in c.fail_to_pass[:shown]]
    return {"level": level, "repo_name": repo_name, "path": c.mutation.path, "function": c.mutation.function,
            "line": c.mutation.lineno, "failing": failing, "n_failing": len(c.fail_to_pass),
            "kind": c.mutation.kind, "description": c.mutation.description}


def task_record(c: Candidate, level: int, repo_name: str, repo_ref: str, base_commit: str,
                opts: SynthOptions) -> dict[str, Any]:
    m = c.mutation
    return {
        "instance_id": f"{repo_name}-{m.key[:10]}",
        "repo": repo_ref,
        "base_commit": base_commit,
        "patch": make_patch({m.path: (m.mutated, m.original)}),
        "test_patch": "",
        "FAIL_TO_PASS": c.fail_to_pass,
        "PASS_TO_PASS": c.pass_to_pass,
        "problem_statement": problem_statement(_statement_context(c, level, repo_name), opts.statement_hook),
        "level": level,
        # Extensions: the bug as a diff on the clean snapshot (see repos.py), and where it is.
        "bug_patch": make_patch({m.path: (m.original, m.mutated)}),
        "mutation": {"kind": m.kind, "path": m.path, "function": m.function, "line": m.lineno,
                     "description": m.description},
        "created_by": f"evotrainer tasks synth (seed {opts.seed})",
    }


def verify(record: dict[str, Any], base: Path, grader: Grader | None = None) -> tuple[bool, str]:
    """Gold resolves and the empty patch does not, under the real grader."""
    grader = grader or Grader(cache=None)
    task = task_from_dict(record, base=base, where=record["instance_id"])  # the grader applies bug_patch
    gold = grader.grade(task, record["patch"])
    if not gold.outcome.success:
        return False, f"gold does not resolve ({gold.outcome.kind}, {gold.outcome.flags}):\n{gold.log[-1500:]}"
    empty = grader.grade(task, "")
    if empty.outcome.success:
        return False, "the empty patch resolves"
    return True, ""


# ---------------------------------------------------------------- the whole synthesis


def synthesize(repo: Path | str, out: Path | str, opts: SynthOptions, snapshot: Path | str | None = None,
               name: str | None = None) -> list[dict[str, Any]]:
    """Write up to `opts.n` tasks for `repo` to `out` (JSONL) and return them."""
    repo, out = Path(repo).resolve(), Path(out).resolve()
    say = opts.progress or (lambda _msg: None)
    name = name or repo.name
    out.parent.mkdir(parents=True, exist_ok=True)
    if snapshot is not None:
        root = repos.snapshot(repo, Path(snapshot), name)
        repo_ref = os.path.relpath(root, out.parent)
        base_commit = repos.git_head(repo) or f"snapshot-{root.name.rsplit('-', 1)[-1]}"
        say(f"snapshot: {root}")
    else:
        root = repo
        repo_ref = str(repo)
        base_commit = repos.git_head(repo) or f"snapshot-{repos.content_hash(repo)}"

    sources, test_files = discover(root, opts.include)
    if not sources or not test_files:
        raise ValueError(f"{repo}: need Python source files and pytest test files "
                         f"(found {len(sources)} source, {len(test_files)} test)")
    ids = collect(root, test_files, opts.baseline_timeout_s)
    base_run, dropped = baseline(root, ids, test_files, opts.baseline_timeout_s, say)
    ids = [i for i in ids if i not in dropped]
    base_status = base_run.status
    passing = sum(s == "passed" for s in base_status.values())
    say(f"baseline: {len(ids)} tests, {passing} pass")
    if not passing:
        raise SynthError(f"{repo}: no test passes before any mutation:\n{base_run.log}")
    index = _TestIndex.build(root, ids, dropped)

    texts = {rel: (root / rel).read_text(encoding="utf-8") for rel in sources}
    all_sites = [s for rel in sources for s in mutate.sites(rel, texts[rel])]
    ordered = mutate.order(all_sites, opts.seed, prefer=lambda s: index.mentions(s.function))
    ordered = ordered[: opts.max_candidates]
    say(f"{len(all_sites)} mutation sites in {len(sources)} files; trying up to {len(ordered)}")

    kept: list[Candidate] = []
    seen: set[str] = set()
    grader = Grader(cache=None) if opts.verify else None
    records: list[dict[str, Any]] = []
    tried = 0
    per_function: dict[tuple[str, str], int] = {}
    with ThreadPoolExecutor(max(1, opts.workers)) as pool:
        for start in range(0, len(ordered), max(1, opts.workers)):
            if len(records) >= opts.n:
                break
            batch = [s for s in ordered[start:start + max(1, opts.workers)]
                     if per_function.get((s.path, s.function), 0) < opts.max_per_function]
            results = list(pool.map(lambda s: _evaluate(root, index, base_status, texts[s.path], s, opts), batch))
            for cand in results:  # in order: the kept set is a prefix of the seeded order
                tried += 1
                if cand is None or cand.mutation.key in seen or len(records) >= opts.n:
                    continue
                where = (cand.site.path, cand.site.function)
                if per_function.get(where, 0) >= opts.max_per_function:
                    continue
                seen.add(cand.mutation.key)
                level = opts.levels[len(records) % len(opts.levels)]
                record = task_record(cand, level, name, repo_ref, base_commit, opts)
                if grader is not None:
                    ok, why = verify(record, out.parent, grader)
                    if not ok:
                        say(f"dropped {record['instance_id']}: {why.splitlines()[0]}")
                        continue
                kept.append(cand)
                records.append(record)
                per_function[where] = per_function.get(where, 0) + 1
                say(f"[{len(records)}/{opts.n}] {record['instance_id']} {cand.mutation.kind} in "
                    f"{cand.mutation.function} ({len(cand.fail_to_pass)} F2P, {len(cand.pass_to_pass)} P2P)")
    say(f"kept {len(records)} of {tried} candidates tried")
    write_jsonl(out, records)
    return records


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=False) + "\n")


def record_digest(records: Sequence[dict[str, Any]]) -> str:
    """A digest of a task list (for determinism checks)."""
    return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()


__all__ = ["SynthOptions", "synthesize", "problem_statement", "verify", "discover", "collect", "run_tests",
           "write_jsonl", "record_digest", "LEVELS"]
