"""verl: its rollout dumps in, the harness out as a custom reward module.

**In.** With `trainer.rollout_data_dir` (or `validation_data_dir`) set, verl's `RayPPOTrainer`
writes one `{step}.jsonl` per step (`_dump_generations` -> `_write_generations`, verl 0.9.x):
one line per generation with `input`, `output`, `gts` (the ground truth), `score` (the summed
token-level reward) and `step`, plus every reward extra-info list as long as the batch (`acc`,
`pred`, `request_id`, a `uid` when the reward function returns one). A GRPO group is the
generations of one prompt in one step; verl does not dump its `uid` unless the reward function
returns it, so the group is the `uid` when a line has one, else the repeated `input` within the
file's step. `request_id` names one generation, not a group: it is kept with the rest.

**Out.** `export_module` writes a module that verl's `get_custom_reward_fn` loads by
`custom_reward_function.path` / `.name` (`compute_score`, or `compute_score_batch` for verl's
batch reward manager). It holds the harness files of one commit as data, records that commit,
and scores through `integrations.scoring.HarnessScorer`: the domain's check, then reward.py in a
sandbox worker started in the user's process.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evotrainer.errors import UserError
from evotrainer.integrations.imported import Record, number, read_each, record_error, text
from evotrainer.store.line_checks import lines, parse

SOURCE = "verl"
REQUIRED = ("input", "output", "gts", "score", "step")
EXPORTED_NAME = "compute_score"


def dump_files(paths: Sequence[Path]) -> list[Path]:
    """The dump files named: files as given, a folder's `*.jsonl` in step order."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"), key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit() else 0, p.name))
            if not found:
                raise UserError(f"{path}: no *.jsonl files (verl writes one {{step}}.jsonl per step)")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise UserError(f"no such file or folder: {path}")
    return out


def _answer(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _record(where: str, line: int, data: Any) -> Record:
    if not isinstance(data, dict):
        raise ValueError("a line must be a JSON object (verl's dump writes one per generation)")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(repr(k) for k in missing)}")
    step = data["step"]
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError("field 'step' must be an integer")
    group = data.get("uid")
    fields = {k: v for k, v in data.items() if k not in ("input", "output", "gts")}
    return Record(where=where, line=line, step=step, prompt=text(data["input"], "input"),
                  completion=text(data["output"], "output"), answer=_answer(data["gts"]),
                  score=number(data["score"], "score"), group=group if isinstance(group, str) else None,
                  fields=fields)


def read_dump(path: Path) -> tuple[list[Record], list[tuple[str, int, str]]]:
    """The records of one `{step}.jsonl` and the errors of its bad lines (all lines one step)."""
    where = str(path)
    records: list[Record] = []
    errors: list[tuple[str, int, str]] = []
    first: tuple[int, int] | None = None  # (line, step) of the first good line
    with open(path, "rb") as f:
        for number_, raw in lines(f):
            try:
                rec = _record(where, number_, parse(raw))
            except ValueError as exc:
                errors.append(record_error(where, number_, str(exc)))
                continue
            if first is None:
                first = (number_, rec.step or 0)
                if path.stem.isdigit() and int(path.stem) != rec.step:
                    errors.append((where, number_, f"step {rec.step} in a file named for step {path.stem}"))
            elif rec.step != first[1]:
                errors.append((where, number_, f"step {rec.step} differs from step {first[1]} on line {first[0]}: "
                                               "one dump file holds one step"))
                continue
            records.append(rec)
    if not records and not errors:
        errors.append((where, 0, "no records (an empty dump file)"))
    return records, errors


def read_dumps(paths: Sequence[Path]) -> tuple[list[Record], list[tuple[str, int, str]]]:
    return read_each(dump_files(paths), read_dump)


# ----------------------------------------------------------------------------- out

MODULE = '''"""A verl custom reward function: the evotrainer harness at commit {commit_short}.

Written by `evotrainer export verl` from {workdir} (rev {rev}, domain {domain!r}). Point verl at it:

    reward.custom_reward_function.path={out_name}
    reward.custom_reward_function.name=compute_score          # or compute_score_batch (batch manager)

The harness files below are data: their code runs only in an evotrainer sandbox worker, started
in this process on the first call (evotrainer must be installed where verl's reward runs). The
domain's trusted check gives each completion its verified outcome; reward.py turns it into the
reward, weighted by harness.yaml's reward_weights, exactly as evotrainer's own trainer and
backtest score it.
"""

HARNESS_COMMIT = {commit!r}
DOMAIN = {domain!r}
HARNESS_SOURCES = {sources}

_scorer = None


def _get_scorer():
    global _scorer
    if _scorer is None:
        from evotrainer.integrations.scoring import HarnessScorer

        _scorer = HarnessScorer(HARNESS_SOURCES, HARNESS_COMMIT, DOMAIN)
    return _scorer


def _prompt(extra_info):
    return str((extra_info or {{}}).get("question", "")) if isinstance(extra_info, dict) else ""


def _result(scored):
    return {{"score": scored.reward, "acc": bool(scored.outcome.success), **scored.components}}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """verl's per-sample signature; the extra keys come back as reward extra info."""
    [scored] = _get_scorer().score([_prompt(extra_info)], [solution_str], [ground_truth])
    return _result(scored)


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, **kwargs):
    """verl's batch reward manager's signature: one sandbox round trip for the whole batch."""
    extra_infos = extra_infos if extra_infos is not None else [None] * len(solution_strs)
    scored = _get_scorer().score([_prompt(e) for e in extra_infos], list(solution_strs), list(ground_truths))
    return [_result(s) for s in scored]
'''


def render_module(*, sources: dict[str, str], commit: str, domain: str, workdir: str, rev: str, out_name: str) -> str:
    body = json.dumps(dict(sorted(sources.items())), indent=4, ensure_ascii=True)
    def plain(value: str) -> str:  # inside the docstring: no quote or backslash may end or escape it
        return value.replace("\\", "/").replace('"', "'")

    return MODULE.format(commit=commit, commit_short=commit[:12], domain=domain, sources=body,
                         workdir=plain(workdir), rev=plain(rev), out_name=plain(out_name))


def export_module(workdir: Path, rev: str, out: Path) -> str:
    """Write the reward module for the harness at `rev`; returns the commit it records."""
    from evotrainer.harness.repo import HarnessRepo
    from evotrainer.workspace import Workspace

    ws = Workspace(workdir)
    if not ws.exists() or ws.domain is None:
        raise UserError(f"{workdir}: not a workspace (no harnesses/ git repo)")
    repo = HarnessRepo(ws.harnesses)
    commit = repo.resolve(rev)
    out.write_text(render_module(sources=repo.sources(commit), commit=commit, domain=ws.domain,
                                 workdir=str(ws.root), rev=rev, out_name=out.name), encoding="utf-8")
    return commit

