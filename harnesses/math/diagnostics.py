"""Health probes for math: the standard table (evotrainer.api.probes.STANDARD) with what this
seed changes.

Thresholds with a source: dead data > 50% is critical, average turns < 5 is critical, echo traps
are > 60 turns without success. The rest are starting points the outer agent may revise (pass
`name=(warn, critical)` to standard()); a probe of its own is a function
fn(rollouts, rewards) -> float | None and one more `probe(...)` entry appended to PROBES.
mean_tokens keeps the standard thresholds (warn 24, critical 30), which fit this seed's
max_completion_length of 32.
The library's mean_kl is not in the table: the trainer measures KL only where harness.yaml sets
beta > 0 (with beta 0 it would always read n/a); a harness that sets beta appends it.
"""

from evotrainer.api.probes import probe, standard  # noqa: F401  (probe: for the entries appended below)

PROBES = standard()
