"""The outer loop: co-evolve the harness while the policy trains."""

from evotrainer.coevolve.loop import Coevolution
from evotrainer.coevolve.state import RunState
from evotrainer.coevolve.verify import Verdict, verify

__all__ = ["Coevolution", "RunState", "Verdict", "verify"]
