"""The stratified-memory curriculum as harness code: a curriculum.py the outer agent (or a
person) can commit to a harness, built from strata.py's own source so both never drift."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from evotrainer.memory import strata
from evotrainer.memory.strata import StrataPolicy

_TEMPLATES = Path(__file__).with_name("templates")


def _body() -> str:
    """strata.py without its module docstring (the template writes its own)."""
    source = Path(strata.__file__).read_text(encoding="utf-8")
    end = source.index('"""', 3) + 3
    return source[end:].strip("\n")


def curriculum_source(domain: str = "any", **overrides: Any) -> str:
    """The text of a curriculum.py whose `weights` is `stratified_weights` under
    StrataPolicy(**overrides); a bad override raises ValueError/TypeError here, not in a run."""
    policy = StrataPolicy(**overrides)  # validates
    params = {k: repr(dict(v) if k == "shares" else v) for k, v in overrides.items()}
    env = Environment(loader=FileSystemLoader(str(_TEMPLATES)), undefined=StrictUndefined,
                      keep_trailing_newline=True)
    shown = asdict(policy)
    shown["shares"] = dict(policy.shares)
    return env.get_template("curriculum.py.j2").render(domain=domain, policy=shown, params=params,
                                                       strata_body=_body())
