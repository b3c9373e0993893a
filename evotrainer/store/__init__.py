"""The rollout store: SQL persistence of runs, rounds, tasks, rollouts and evals, plus JSONL.

The only package that builds SQL: other stages call the Store's named methods.
"""

from evotrainer.store.jsonl import ImportErrors, ImportRefused, ImportSummary, export_jsonl, import_jsonl
from evotrainer.store.models import ROLLOUT_ID_CHARS
from evotrainer.store.sql import RolloutScope
from evotrainer.store.store import Store, StoredRollout

__all__ = ["ROLLOUT_ID_CHARS", "RolloutScope", "Store", "StoredRollout", "ImportErrors", "ImportRefused",
           "ImportSummary", "export_jsonl", "import_jsonl"]
