"""The rollout store: SQL persistence of runs, rounds, tasks, rollouts and evals, plus JSONL."""

from evotrainer.store.jsonl import ImportErrors, ImportSummary, export_jsonl, import_jsonl
from evotrainer.store.store import Store, StoredRollout

__all__ = ["Store", "StoredRollout", "ImportErrors", "ImportSummary", "export_jsonl",
           "import_jsonl"]
