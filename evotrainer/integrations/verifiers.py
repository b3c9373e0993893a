"""verifiers: what `vf-eval` saves in, the harness out as a `Rubric`.

**In.** `vf-eval` (verifiers 0.3.x, `legacy/utils/save_utils.py`: `state_to_output`, then
`save_outputs`) writes `results.jsonl` in its results folder (beside `metadata.json`): one line
per rollout with `example_id`, `prompt` and `completion` (chat messages, or text), `answer` and
`info` (left out when empty), `reward`, `metrics` (each rubric function's value, also repeated at
the top level), `is_truncated`, `error` and `token_usage`. The rollouts of one example form a
group. The answer is what the domain rechecks; `--outcome-field NAME` takes a metric instead.

**Out.** `harness_rubric(workdir, rev)` is a `vf.Rubric` with one reward function, the harness's
training reward after the domain's check, computed in a sandbox worker
(integrations/scoring.py); the commit it came from is `rubric.harness_commit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evotrainer.errors import UserError
from evotrainer.integrations.imported import Record, as_text, number, read_each, record_error
from evotrainer.store.line_checks import lines, parse

SOURCE = "verifiers"
RESULTS = "results.jsonl"
REQUIRED = ("example_id", "prompt", "completion", "reward")


def results_files(paths: Sequence[Path]) -> list[Path]:
    """results.jsonl files: as given, or inside a results folder (searched below it)."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.rglob(RESULTS))
            if not found:
                raise UserError(f"{path}: no {RESULTS} below it (vf-eval saves one per evaluation)")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise UserError(f"no such file or folder: {path}")
    return out


def _messages_or_text(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return as_text(value)
    raise ValueError(f"field {name!r} must be text or a list of chat messages")


def _record(where: str, line: int, data: Any) -> Record:
    if not isinstance(data, dict):
        raise ValueError("a line must be a JSON object (vf-eval writes one per rollout)")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(repr(k) for k in missing)}")
    example = data["example_id"]
    if isinstance(example, bool) or not isinstance(example, (int, str)):
        raise ValueError("field 'example_id' must be an integer or a string")
    metrics = data.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise ValueError("field 'metrics' must be an object")
    components = {str(k): number(v, f"metrics.{k}") for k, v in metrics.items() if v is not None}
    answer = data.get("answer")
    usage = data.get("token_usage") if isinstance(data.get("token_usage"), dict) else {}
    tokens = usage.get("output_tokens", 0)
    fields = {k: v for k, v in data.items() if k not in ("prompt", "completion", "answer")}
    fields.update(components)  # a metric is a field --outcome-field may name
    return Record(where=where, line=line, step=None, prompt=_messages_or_text(data["prompt"], "prompt"),
                  completion=_messages_or_text(data["completion"], "completion"),
                  answer=None if answer in (None, "") else str(answer), score=number(data["reward"], "reward"),
                  group=f"example-{example}", fields=fields, components=components,
                  num_tokens=int(tokens) if isinstance(tokens, (int, float)) and not isinstance(tokens, bool) else 0,
                  truncated=data.get("is_truncated") is True)


def read_results(path: Path) -> tuple[list[Record], list[tuple[str, int, str]]]:
    where = str(path)
    records: list[Record] = []
    errors: list[tuple[str, int, str]] = []
    with open(path, "rb") as f:
        for n, raw in lines(f):
            try:
                records.append(_record(where, n, parse(raw)))
            except ValueError as exc:
                errors.append(record_error(where, n, str(exc)))
    if not records and not errors:
        errors.append((where, 0, "no records (an empty results file)"))
    return records, errors


def read_dumps(paths: Sequence[Path]) -> tuple[list[Record], list[tuple[str, int, str]]]:
    """Every record of the results files named (the `rollouts import --from` reader)."""
    return read_each(results_files(paths), read_results)


def harness_rubric(workdir: Path | str, rev: str = "main") -> Any:
    """A verifiers Rubric whose one reward function is the harness at `rev`."""
    import verifiers as vf

    from evotrainer.integrations.scoring import HarnessScorer

    scorer = HarnessScorer.from_workspace(workdir, rev)

    def harness(prompt: Any, completion: Any, answer: Any, **kwargs: Any) -> float:
        [scored] = scorer.score([as_text(prompt)], [as_text(completion)], [answer if answer != "" else None])
        return scored.reward

    harness.__name__ = f"harness_{scorer.commit[:12]}"
    rubric = vf.Rubric(funcs=[harness], weights=[1.0])
    rubric.harness_commit = scorer.commit  # the commit it came from
    rubric.harness_scorer = scorer  # close() stops its sandbox worker
    return rubric
