"""`python -m evotrainer` (also what `accelerate launch -m evotrainer` runs)."""

from evotrainer.cli.main import main

main()
