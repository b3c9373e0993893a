"""The tool registry: each tool's name, one-line description, JSON schema and function, and the
argument check every call goes through before the function runs.

The schema is plain JSON Schema (the subset below), so a tool-calling client (OpenAI's `tools`
list) and an MCP server can both publish the same registry. `check_args` implements that subset
here rather than depending on a schema library: object, string, integer, number, boolean, array;
`required`, `enum`, `minimum`/`maximum`, `minLength`/`maxLength`, `items`, and
`additionalProperties` (false, or a schema for every extra key). Anything else in a schema is a
programming error, caught by tests/test_agent_tools.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# The outcome of a call that did not return a value: each is a named, countable state.
BAD_ARGUMENTS = "bad_arguments"  # the arguments do not fit the tool's schema
UNKNOWN_TOOL = "unknown_tool"
NOT_FOUND = "not_found"  # a rollout, backtest, skill, file or revision that does not exist
REFUSED = "refused"  # the trust boundary said no (held-out data, a path outside, a protected file)
FAILED = "failed"  # the tool ran and its work failed (a harness fault, a refused git write)
BUDGET_EXHAUSTED = "budget_exhausted"  # max_calls reached
SUBMIT_LIMIT = "submit_limit"  # max_submissions reached
ERROR_KINDS = (BAD_ARGUMENTS, UNKNOWN_TOOL, NOT_FOUND, REFUSED, FAILED, BUDGET_EXHAUSTED, SUBMIT_LIMIT)

_KEYWORDS = {"type", "description", "properties", "required", "additionalProperties", "enum", "minimum",
             "maximum", "minLength", "maxLength", "items", "default"}
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


class ToolError(Exception):
    """A call that ends without a value; `kind` is one of ERROR_KINDS. Becomes an error result."""

    def __init__(self, kind: str, message: str):
        assert kind in ERROR_KINDS, kind
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Tool:
    name: str
    description: str  # one line
    group: str  # read | analyse | act
    schema: Mapping[str, Any]  # JSON schema of the arguments object
    fn: Callable[..., Any]  # fn(toolbox, **args) -> JSON-serialisable value

    def spec(self) -> dict[str, Any]:
        """The tool as an OpenAI-compatible `tools` entry (an MCP server maps the same three fields)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": dict(self.schema)}}


TOOLS: dict[str, Tool] = {}


def tool(name: str, description: str, group: str, properties: Mapping[str, Any] | None = None,
         required: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `fn` as a tool taking one JSON object whose keys are `properties`."""
    schema = {"type": "object", "properties": dict(properties or {}), "required": list(required),
              "additionalProperties": False}
    check_schema(schema, name)

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in TOOLS:
            raise ValueError(f"tool {name!r} registered twice")
        TOOLS[name] = Tool(name, description, group, schema, fn)
        return fn

    return wrap


def check_schema(schema: Mapping[str, Any], where: str) -> None:
    """A schema uses only the keywords check_args understands."""
    unknown = set(schema) - _KEYWORDS
    if unknown or schema.get("type") not in _TYPES:
        raise ValueError(f"{where}: schema keywords {sorted(unknown)} / type {schema.get('type')!r} not supported")
    for key, sub in (schema.get("properties") or {}).items():
        check_schema(sub, f"{where}.{key}")
    for sub in (schema.get("items"), schema.get("additionalProperties")):
        if isinstance(sub, Mapping):
            check_schema(sub, f"{where}[]")


def check_args(schema: Mapping[str, Any], value: Any, where: str = "arguments") -> None:
    """Raise ToolError(bad_arguments) naming the first argument that does not fit `schema`."""
    kind = schema["type"]
    if not _TYPES[kind](value):
        raise ToolError(BAD_ARGUMENTS, f"{where} must be {'an' if kind[0] in 'aeio' else 'a'} {kind}, "
                                       f"got {type(value).__name__}")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolError(BAD_ARGUMENTS, f"{where} must be one of {schema['enum']}, got {value!r}")
    if kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            raise ToolError(BAD_ARGUMENTS, f"{where} must be >= {schema['minimum']}, got {value!r}")
        if "maximum" in schema and value > schema["maximum"]:
            raise ToolError(BAD_ARGUMENTS, f"{where} must be <= {schema['maximum']}, got {value!r}")
    if kind == "string":
        if len(value) < schema.get("minLength", 0):
            raise ToolError(BAD_ARGUMENTS, f"{where} must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise ToolError(BAD_ARGUMENTS, f"{where} must have at most {schema['maxLength']} characters, "
                                           f"got {len(value)}")
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            check_args(schema["items"], item, f"{where}[{i}]")
    if kind == "object":
        props = schema.get("properties") or {}
        for key in schema.get("required") or ():
            if key not in value:
                raise ToolError(BAD_ARGUMENTS, f"{where}: missing required argument {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                check_args(props[key], item, f"{key}" if where == "arguments" else f"{where}.{key}")
            elif extra is False:
                raise ToolError(BAD_ARGUMENTS, f"{where}: unknown argument {key!r} "
                                               f"(known: {', '.join(props) or 'none'})")
            elif isinstance(extra, Mapping):
                check_args(extra, item, f"{where}[{key!r}]")
