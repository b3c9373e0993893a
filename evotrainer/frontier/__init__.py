"""Self-questioning: new tasks near the policy's frontier (variants of tasks whose pass rate sits
in a band; for SWE, new bug injections in the modules where the policy fails), each validated by
the trusted checker and deduplicated before use."""

from evotrainer.frontier.synthesize import FrontierReport, frontier_tasks, in_band, synthesize_frontier, write_report
from evotrainer.frontier.validate import Deduper, Verdict, check_task, prompt_hash
from evotrainer.frontier.variants import NoVariant, variant

__all__ = ["Deduper", "FrontierReport", "NoVariant", "Verdict", "check_task", "frontier_tasks", "in_band",
           "prompt_hash", "synthesize_frontier", "variant", "write_report"]
