"""The shape of a `skill.yaml`, as strict pydantic models, and its errors as `field: what is wrong`.

Only the file's own content is checked here; what needs the skill's folder (the name matching it,
the templates existing and parsing) is checked by `library.parse_skill`.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from evotrainer.harness.repo import allowed_file

MAX_NAME = 40
_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def _name(value: str) -> str:
    if _NAME.fullmatch(value) is None or len(value) > MAX_NAME:
        raise ValueError(f"must be lowercase words joined by '-' (at most {MAX_NAME} chars)")
    return value


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("must be text")
    return value


def _harness_file(value: str) -> str:
    if not allowed_file(value):
        raise ValueError("is not a harness file")
    return value


def _file_name(value: str) -> str:
    if "/" in value:
        raise ValueError("must be a file in the skill's folder")
    return value


def _identifier(value: str) -> str:
    if not value.isidentifier():
        raise ValueError("must be an identifier")
    return value


def _or(empty: Any) -> BeforeValidator:
    """A field left empty (`grid:`, `grid: {}`) reads as `empty`."""
    return BeforeValidator(lambda value: value or empty)


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, dict) else value


Status = Literal["seed", "validated", "failed"]
Number = Annotated[float, Field(allow_inf_nan=False)]  # strict: an int is fine, a bool is not
Text = Annotated[str, Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TriggerFile(_Strict):
    probe: Text
    op: Literal[">", ">=", "<", "<="]
    value: Number


class EditFile(_Strict):
    file: Annotated[str, AfterValidator(_harness_file)]
    template: Annotated[str, AfterValidator(_file_name)] | None = None
    set: Annotated[dict[Text, Any], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _an_edit(self) -> EditFile:
        if self.template is None and self.set is None:
            raise ValueError("an edit is {file, template} and/or {file, set}")
        if self.set is not None and not self.file.endswith(".yaml"):
            raise ValueError("set edits YAML files only")
        return self


class ExpectedFile(_Strict):
    model_config = ConfigDict(extra="allow")  # free notes beside the three keys have always been kept

    metric: str
    direction: Literal["increase", "decrease"]
    note: str


class ValidationFile(_Strict):
    model_config = ConfigDict(extra="allow")

    targets: str = ""  # a backtest metric; empty means expected.metric
    # No default of its type: absent is fine, an explicit `margin: null` is not a number.
    margin: Number = None  # type: ignore[assignment]


class SkillFile(_Strict):
    name: Annotated[str, AfterValidator(_name)]
    summary: Annotated[str, AfterValidator(_text)]
    trigger: Annotated[list[TriggerFile], BeforeValidator(_one_or_many), Field(min_length=1)]  # any fires
    intervention: Annotated[list[EditFile], Field(min_length=1)]
    grid: Annotated[dict[Annotated[str, AfterValidator(_identifier)], Annotated[list[Any], Field(min_length=1)]],
                    _or({})] = {}
    expected: ExpectedFile
    validation: Annotated[ValidationFile, _or({})] = ValidationFile()
    domains: Annotated[list[str], Field(min_length=1)]
    status: Status = "seed"
    evidence: Annotated[list[dict[Any, Any]], _or([])] = []
    default_on: bool = True


def read(raw: Any) -> SkillFile:
    """`raw` (a parsed skill.yaml) checked; a ValueError lists every problem, one `field: what` each."""
    try:
        return SkillFile.model_validate(raw)
    except ValidationError as exc:
        one_trigger = isinstance(raw, Mapping) and isinstance(raw.get("trigger"), Mapping)
        raise ValueError("; ".join(problem(e, one_trigger) for e in exc.errors())) from None


_short = reprlib.Repr()
_short.maxlevel, _short.maxlist, _short.maxdict, _short.maxstring, _short.maxother = 2, 4, 4, 40, 40


def _where(loc: tuple[Any, ...], one_trigger: bool) -> str:
    """`intervention[0].file`; a trigger written as one mapping, not a list, is named `trigger`."""
    if one_trigger and loc[:2] == ("trigger", 0):
        loc = ("trigger",) + loc[2:]
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def problem(error: Mapping[str, Any], one_trigger: bool = False) -> str:
    """One pydantic error as `field: what is wrong` (also used for fault-case files)."""
    loc, kind, value = tuple(error["loc"]), error["type"], error.get("input")
    where = _where(loc, one_trigger)
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "missing":
        return f"{where}: missing"
    if kind in ("extra_forbidden", "invalid_key"):
        return f"{_where(loc[:-1], one_trigger) or 'top level'}: unknown key {_short.repr(loc[-1])}"
    if kind in ("model_type", "dict_type"):
        return f"{where + ': ' if where else ''}expected a mapping, got {type(value).__name__}"
    if loc[-1:] == ("[key]",):  # loc is (..., key, "[key]")
        return f"{_where(loc[:-2], one_trigger)}: key {_short.repr(value)}: {message}"
    if kind == "too_short":
        message = "must not be empty"
    return f"{where}: {message}, got {_short.repr(value)}"
