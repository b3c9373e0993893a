"""Run by tests/test_distributed.py under a real 2-process launch (torch.distributed.run, gloo):
each rank writes what it saw of the rank-0-writes rule to <out>/rank<N>.json."""
import json
import sys
from pathlib import Path

from evotrainer import dist
from evotrainer.api import Outcome, Rollout
from evotrainer.config import load_config
from evotrainer.store import StoredRollout
from evotrainer.train.loop import open_session

out = Path(sys.argv[1])
cfg = load_config(None, ["domain.train_size=4", "domain.heldout_size=2"], domain="math")
session = open_session(cfg, out / "work")  # both ranks, one empty workdir: rank 0 creates it
store = session.store
round_id = dist.share(store.start_round(session.run_id, 0, session.harness.version, "base")
                      if dist.is_main() else None)
r = dist.rank()
rows = [StoredRollout(rollout=Rollout(id=f"rank{r}-{i}", task_id=session.train_tasks[0].task_id, group_id=f"g{r}",
                                      domain="math", prompt="p", completion="c", turns=(), num_tokens=1,
                                      truncated=False, outcome=Outcome(False, 0.0, "wrong")),
                      run_id=session.run_id, round_id=round_id, step=0)
        for i in range(3 + r)]  # ranks hold different counts: the gather must keep every row
dist.GatheredRollouts(store).add_rollouts(rows)
dist.barrier()
ids = sorted(s.rollout.id for s in store.iter_rollouts(run_id=session.run_id))
(out / f"rank{r}.json").write_text(json.dumps({
    "rank": r, "world": dist.world_size(), "main": dist.is_main(), "run_id": session.run_id,
    "round_id": round_id, "ids": ids, "gathered": dist.gather([r])}))
dist.barrier()
import torch.distributed  # noqa: E402

torch.distributed.destroy_process_group()
