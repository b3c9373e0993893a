"""Outer agents: evidence (health report, sample rollouts) + harness sources + skills -> proposals.

Importing this package registers every agent, so `get_agent("rules")` works after it.
"""

from evotrainer.propose import (
    rules,  # noqa: F401  (registers "rules")
    structural,  # noqa: F401  (registers "structural": rules plus ablations)
)
from evotrainer.propose.base import Agent, Evidence, Proposal, get_agent, register_agent

try:
    from evotrainer.propose import (
        llm,  # noqa: F401  (registers "llm")
        llm_tools,  # noqa: F401  (registers "llm-tools", the llm agent's tools mode)
    )
except ImportError as exc:  # not written yet, or its optional client library is missing
    if getattr(exc, "name", None) not in ("evotrainer.propose.llm", "evotrainer.propose.llm_tools", "openai"):
        raise

__all__ = ["Agent", "Evidence", "Proposal", "get_agent", "register_agent"]
