#!/usr/bin/env bash
# The loop beside verl, end to end on one machine, no GPU: verl's own writer dumps a step,
# evotrainer imports it, diagnoses, backtests a change and exports it; verl's own loader scores
# with the export. Usage: examples/verl/try_locally.sh [WORKDIR]   (needs `make setup`)
set -euo pipefail
PY=${PY:-.venv/bin/python}
ET=${ET:-.venv/bin/evotrainer}
W=${1:-$(mktemp -d)/work}
DUMP=$(mktemp -d)

$PY - "$DUMP" <<'PY'
import sys, warnings
warnings.filterwarnings("ignore")
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
# Step 7 of a GRPO run: 2 prompts x 4 generations; verl's reward paid 1.0 for a wrong "Answer: 6".
inputs = ["What is 2 + 3?"] * 4 + ["What is 7 * 6?"] * 4
outputs = ["Answer: 5", "2 + 3 = 5, so the answer is 5. Answer: 5", "Answer: 6", "five",
           "Answer: 42", "7 * 6 = 42. Answer: 42", "Answer: 41", "Answer: 42"]
gts = ["5"] * 4 + ["42"] * 4
scores = [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
acc = [True, True, True, False, True, True, False, True]
RayPPOTrainer._write_generations(inputs, outputs, gts, scores, {"acc": acc}, sys.argv[1], 7)
PY

$ET rollouts import --from verl --domain math "$DUMP" -w "$W"
$ET diagnose -w "$W" --name step7
git -C "$W/harnesses" switch -q -c candidate/0-length-penalty
$PY - "$W/harnesses/reward.py" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read().replace('"format": 1.0 if rollout.outcome.kind in ("ok", "wrong") else 0.0,',
                                 '"format": 1.0 if rollout.outcome.kind in ("ok", "wrong") else 0.0,\n'
                                 '        "length": -0.005 * len(rollout.completion),')
open(path, "w").write(text)
PY
git -C "$W/harnesses" commit -q -am "reward: a small length penalty"
$ET backtest candidate/0-length-penalty -w "$W"
$ET export verl --workdir "$W" --rev candidate/0-length-penalty -o "$W/reward.py"
$PY - "$W/reward.py" <<'PY'
import sys, warnings
warnings.filterwarnings("ignore")
from omegaconf import OmegaConf
from verl.trainer.ppo.reward import get_custom_reward_fn
cfg = OmegaConf.create({"reward": {"custom_reward_function": {"path": sys.argv[1], "name": "compute_score_batch"}}})
fn = get_custom_reward_fn(cfg)
for out, r in zip(["Answer: 5", "Answer: 6", "five"], fn(["math"] * 3, ["Answer: 5", "Answer: 6", "five"], ["5"] * 3)):
    print(f"verl's loader, exported harness: {out!r:14} -> score {r['score']:+.3f} (acc {r['acc']})")
PY
