"""evotrainer beside another RL engine: rollouts in from verl, TRL and verifiers; the harness out to them.

One module per engine (`verl`, `trl`, `verifiers`). What they share: `imported` turns an engine's
records into stored rollouts (the engine's score kept as its reward, the outcome from a trusted
check or marked source-reported), and `scoring` runs a workspace's harness on completions from
another process, always in our sandbox workers. Each engine module imports its engine lazily, so
this package loads without any of them installed.
"""
