"""The judge's reply schemas (pydantic) and the parser that turns reply text into a checked verdict."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evotrainer.chat import ReplyError, reply_json

STEP_LABELS = ("GOOD", "BAD")


class VerdictError(ReplyError):
    """A reply that is not a valid verdict; the message goes back to the judge on a retry."""


class Verdict(BaseModel):
    """One judge's structured verdict on one rollout (a proxy signal, never a verified outcome)."""

    # Strict types: "yes" or 1 is not a success, "4" is not a quality. A sloppy reply is retried,
    # never read generously into a pass.
    model_config = ConfigDict(extra="ignore", strict=True)

    success: bool
    quality: int = Field(ge=1, le=5)
    failure_reason: str = ""
    suggestion: str = ""


class StepVerdict(BaseModel):
    """A judge's GOOD/BAD label for each assistant step of a trajectory, in order."""

    model_config = ConfigDict(extra="ignore", strict=True)

    labels: list[Literal["GOOD", "BAD"]]


def _json_object(text: str) -> dict[str, Any]:
    text = (text or "").strip()
    if not text:
        raise VerdictError("the reply is empty")
    data, problem = reply_json(text, dict)
    if problem is not None or data is None:
        raise VerdictError(f"the reply is not a JSON object ({problem})")
    return data


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(reply)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def parse_verdict(text: str) -> Verdict:
    """The verdict in a reply (bare JSON or a ```json fence); VerdictError says what is wrong."""
    data = _json_object(text)
    try:
        return Verdict.model_validate(data)
    except ValidationError as exc:
        raise VerdictError(_explain(exc)) from None


def parse_step_verdict(text: str, n_steps: int) -> StepVerdict:
    """The step labels in a reply; exactly one label per step or VerdictError."""
    data = _json_object(text)
    if isinstance(data.get("labels"), list):  # "good" is as clear as "GOOD"; anything else is not
        data = {**data, "labels": [v.upper() if isinstance(v, str) else v for v in data["labels"]]}
    try:
        verdict = StepVerdict.model_validate(data)
    except ValidationError as exc:
        raise VerdictError(_explain(exc)) from None
    if len(verdict.labels) != n_steps:
        raise VerdictError(f"labels: {len(verdict.labels)} labels for {n_steps} steps; give exactly one per step")
    return verdict


__all__ = ["STEP_LABELS", "StepVerdict", "Verdict", "VerdictError", "parse_step_verdict", "parse_verdict"]
