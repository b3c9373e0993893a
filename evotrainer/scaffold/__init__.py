"""Policy scaffolds for the swe domain, chosen in config: `edit` (one turn, SEARCH/REPLACE blocks,
edit.py), `line` (one turn, the buggy line the prompt names rewritten in a code block, line.py; for
small policies) and `agent` (multi-turn tools over a working copy of the repo, agent.py)."""

SCAFFOLDS = ("edit", "line", "agent")

__all__ = ["SCAFFOLDS"]
