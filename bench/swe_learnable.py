"""Is the swe domain learnable by the embedded model? Sample the base policy on every task of the
chosen levels, grade each completion with the trusted check, and print, per level and per task,
what GRPO would see: the success rate, the share of tasks with at least one success in a group
(a "live" group carries a learning signal), truncation, and how far the edits got.

    python bench/swe_learnable.py [--scaffold edit|line] [--levels 0 1] [--k 8] [--max-tokens 128 256]
                                  [--excerpt-lines 40] [--temperature 1.0] [--threads 1] [--json out.json]

Several --max-tokens values are measured in one run from the same samples: a completion is
generated once at the largest length and cut to each shorter one (what a shorter limit would
have produced, token for token, under the same seed).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scaffold", default="edit", choices=["edit", "line"])
    ap.add_argument("--levels", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--k", type=int, default=8, help="samples per task (a GRPO group)")
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--excerpt-lines", type=int, default=40)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--source", default="pack")
    ap.add_argument("--harness", default=None, help="harness folder whose rollout.py PROMPT wraps the task "
                                                   "(default: harnesses/swe)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from evotrainer.domains.swe import SweDomain
    from evotrainer.harness.isolated import IsolatedHarness
    from evotrainer.harness.loader import read_sources
    from evotrainer.paths import HARNESSES_DIR
    from evotrainer.policy.hf_backend import chat_prompt
    from evotrainer.policy.load import load_policy

    torch.set_num_threads(args.threads)
    folder = args.harness or HARNESSES_DIR / "swe"
    harness = IsolatedHarness(read_sources(folder), folder)  # harness code runs in its sandbox worker
    domain = SweDomain(levels=args.levels, source=args.source, excerpt_lines=args.excerpt_lines,
                       scaffold=args.scaffold)
    tasks = [t for split in ("train", "heldout") for t in domain.tasks(split, 10_000, 0)]
    model, tok = load_policy("embedded")
    model.eval()
    longest = max(args.max_tokens)
    rows = []
    start = time.perf_counter()
    for i, task in enumerate(tasks):
        text = chat_prompt(tok, harness.render_prompt(task.prompt, scaffold=args.scaffold))
        enc = tok([text] * args.k, return_tensors="pt", add_special_tokens=False)
        torch.manual_seed(args.seed * 100_003 + i)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=longest, do_sample=True, temperature=args.temperature,
                                 top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)
        gen = ids[:, enc["input_ids"].shape[1]:].tolist()
        for limit in args.max_tokens:
            outcomes = []
            for row in gen:
                end = next((j for j, t in enumerate(row) if t == tok.eos_token_id), None)
                body = row[:end] if end is not None and end < limit else row[:limit]
                truncated = end is None or end >= limit
                outcomes.append(domain.check(task, tok.decode(body, skip_special_tokens=True), truncated))
            rows.append({"task": task.task_id, "split": task.split, "level": task.level, "max_tokens": limit,
                         "prompt_tokens": enc["input_ids"].shape[1], "successes": sum(o.success for o in outcomes),
                         "k": args.k, "kinds": dict(Counter(o.kind for o in outcomes)),
                         "flags": dict(Counter(f for o in outcomes for f in o.flags))})
        done = rows[-len(args.max_tokens):]
        print(f"[{i + 1}/{len(tasks)}] {task.task_id} L{task.level} {task.split} prompt {done[0]['prompt_tokens']} tok: "
              + "; ".join(f"@{r['max_tokens']}: {r['successes']}/{r['k']} {r['kinds']}" for r in done), flush=True)
    seconds = time.perf_counter() - start
    print(f"\n{len(tasks)} tasks x {args.k} samples in {seconds:.0f} s ({args.scaffold} scaffold, "
          f"temperature {args.temperature})\n")
    print("| max tokens | level | tasks | success rate | live groups | truncated | format ok | patch applied |")
    print("|---|---|---|---|---|---|---|---|")
    by = defaultdict(list)
    for r in rows:
        by[(r["max_tokens"], r["level"])].append(r)
        by[(r["max_tokens"], "all")].append(r)
    for (limit, level), rs in sorted(by.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        n = sum(r["k"] for r in rs)
        ok = sum(r["successes"] for r in rs)
        live = sum(1 for r in rs if 0 < r["successes"] < r["k"])
        trunc = sum(r["kinds"].get("truncated", 0) for r in rs)
        fmt = sum(r["flags"].get("format_ok", 0) for r in rs)
        applied = fmt - sum(r["kinds"].get("patch_failed", 0) for r in rs) - sum(r["kinds"].get("empty", 0) for r in rs)
        print(f"| {limit} | {level} | {len(rs)} | {ok / n:.3f} ({ok}/{n}) | {live}/{len(rs)} | {trunc / n:.2f} "
              f"| {fmt / n:.2f} | {max(applied, 0) / n:.2f} |")
    harness.close()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "seconds": seconds, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
