"""Policy scaffolds for the swe domain, chosen in config: `edit` (one turn, SEARCH/REPLACE blocks,
edit.py) and `agent` (multi-turn tools over a working copy of the repo, agent.py)."""

SCAFFOLDS = ("edit", "agent")

__all__ = ["SCAFFOLDS"]
