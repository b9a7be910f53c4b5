"""When does an induction head form? A small model watched while it trains.

Trains a 2-block model (d 64, 2 heads of 32, context 128, batch 4 × 128, the main job's recipe v3
with its own warm-up and decay) for a fixed number of minutes per seed, with snapshots on, so the
run scores what each head attends to at steps 0, 1, 2, 4, … and at every evaluation (andrea.heads,
kept in metrics.jsonl; on sequences of the most used segments). Two heads a block, not four: an
induction head is one head doing one job, and with four narrower heads the copying spreads over
several of them. Reports per seed: the step and the tokens at which the best induction score
first passes 0.3 (or "not yet", with the best reached), the previous-token score there, and whether
the loss shows a bump: the smoothed training loss's fall over the steps just before and just after
the crossing (an induction head brings a faster fall, Olsson et al. 2022); and the final model's
best induction score on sequences drawn from every segment, rare ones included. Then the main
job's model, scored the same way (its runs predate the kept scores: the final checkpoint only).

The data (--data):
  repeats  (default) documents made from the main job's training text: a passage of 8 to 32 of its
           tokens, decoded, written three times in a row (BOS + p + p + p), prepared with the main
           job's tokenizer into runs/bench-induction/repeats; copying from context pays on two
           thirds of every document, as it does on the random sequences the heads are scored on
  main     the main job's shards as they are
The positions (--pos): `rope` (default) or `learned`, the family's own position table, which
must learn what "the token before" is before a previous-token head can form.

    .venv/bin/python benchmarks/bench_induction.py                   # 3 seeds × 12 minutes
    .venv/bin/python benchmarks/bench_induction.py --minutes 1 --seeds 1 --pos learned
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from common import REPO, machine_line, main_job_data, md_table, say

from andrea.checkpoint import load_model
from andrea.config import ModelConfig, count_params
from andrea.errors import AndreaError
from andrea.heads import COMMON, PRESENT, score_heads
from andrea.mainjob_settings import MAIN_SEGMENTS, RECIPE_SETTINGS
from andrea.metrics import read_metrics
from andrea.prepare import prepare
from andrea.shards import TokenData
from andrea.train import train
from andrea.trainconfig import TrainConfig

D, HEADS, LAYERS, CONTEXT, BATCH = 64, 2, 2, 128, 4
RECIPE = "v3"  # the main job's recipe, with its peak rate, warm-up and decay
COPIES, SHORTEST, LONGEST, DOCS = 3, 8, 32, 150_000  # the repeats data: a passage of 8-32 tokens, three times
WINDOW = 100  # steps of loss compared before and after the crossing


def crossing(rows: list[dict]) -> tuple[int | None, float, int | None]:
    """(the first step whose best induction score passes PRESENT or None, the best reached, its step)."""
    scored = [(r["step"], r["heads"]["best"]["induction"]) for r in rows if "heads" in r]
    first = next((s for s, v in scored if v > PRESENT), None)
    step, best = max(scored, key=lambda sv: sv[1]) if scored else (None, float("nan"))
    return first, best, step


def loss_fall(rows: list[dict], step: int, window: int = WINDOW) -> tuple[float, float]:
    """How far the smoothed training loss fell over the `window` steps before `step` and after it."""
    smma = {r["step"]: r["smma"] for r in rows if "smma" in r}
    at = lambda s: smma.get(min(max(s, min(smma)), max(smma)), math.nan)  # noqa: E731
    return at(step - window) - at(step), at(step) - at(step + window)


def repeats_data(data_dir: Path, out: Path, seed: int = 0) -> Path:
    """The repeats data (module docstring) in out/data, prepared once: DOCS passages drawn from each
    source of the main job's training split in proportion to its tokens, each written COPIES times."""
    if (out / "data" / "manifest.json").exists():
        return out / "data"
    data = TokenData(data_dir)
    tokenizer = data.load_tokenizer()
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "repeats.jsonl", "w") as f:
        for name, share in data.token_share().items():
            tokens = data.sources[name].train
            k = round(DOCS * share)
            for start, n in zip(rng.integers(0, len(tokens) - LONGEST, size=k), rng.integers(SHORTEST, LONGEST + 1, size=k)):
                text = tokenizer.decode([int(t) for t in tokens[int(start):int(start) + int(n)]])
                f.write(json.dumps({"text": text * COPIES}) + "\n")
    prepare(tokenizer, [f"repeats={out / 'repeats.jsonl'}"], out / "data", log=say, progress=False)
    return out / "data"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=12.0, help="training minutes per seed (default 12)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1337, 1338, 1339])
    ap.add_argument("--data", choices=["repeats", "main"], default="repeats", help="what it trains on (default repeats)")
    ap.add_argument("--pos", choices=["rope", "learned"], default="rope", help="position scheme (default rope)")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench-induction")
    args = ap.parse_args()
    try:
        data_dir = main_job_data(MAIN_SEGMENTS)
        if args.data == "repeats":
            data_dir = repeats_data(data_dir, args.out / "repeats")
        V = TokenData(data_dir).vocab_size
    except AndreaError as e:
        print(f"bench_induction: {e}", file=sys.stderr)
        return 2
    cfg = ModelConfig(vocab_size=V, n_embd=D, n_head=HEADS, n_layer=LAYERS, block_size=CONTEXT, pos=args.pos)
    rows_out, notes = [], []
    start = time.time()
    for seed in args.seeds:
        run = args.out / f"{args.data}-{args.pos}-seed-{seed}"
        say(f"seed {seed}: training for {args.minutes:g} minutes into {run}")
        shutil.rmtree(run, ignore_errors=True)  # a fresh run each call
        tc = TrainConfig(batch_size=BATCH, micro_batch=BATCH, seq_len=CONTEXT, max_steps=10**9,
                         time_limit=args.minutes * 60, eval_every=250, eval_windows=8, checkpoint_every=10**9,
                         seed=seed, audit={"enabled": False}, recipe=RECIPE, **RECIPE_SETTINGS[RECIPE])
        t0 = time.time()
        train(cfg, tc, data_dir, run, log=say, progress=False, resume=False)
        notes.append(f"seed {seed}: {time.time() - t0:.0f} s")
        rows = read_metrics(run / "metrics.jsonl")
        steps = max(r["step"] for r in rows if "loss" in r)
        first, best, best_step = crossing(rows)
        prev = next((r["heads"]["best"]["previous"] for r in rows if "heads" in r and r["step"] == first), None)
        model, _, _ = load_model(run)
        every = score_heads(model.eval(), common=None)["best"]["induction"]
        if first is None:
            rows_out.append([seed, f"{steps:,}", f"{steps * BATCH * CONTEXT / 1e6:.2f} M", "not yet",
                             f"{best:.2f} (step {best_step:,})", "", "", "", f"{every:.2f}"])
            continue
        before, after = loss_fall(rows, first)
        rows_out.append([seed, f"{steps:,}", f"{steps * BATCH * CONTEXT / 1e6:.2f} M", f"{first:,}",
                         f"{best:.2f} (step {best_step:,})", f"{first * BATCH * CONTEXT / 1e6:.2f} M",
                         f"{prev:.2f}", f"{before:.3f} / {after:.3f}: " + ("faster after" if after > before else "not faster"),
                         f"{every:.2f}"])
    main_rows = []
    for ckpt in sorted((REPO / "runs" / "main-corpus").glob(f"segments-{MAIN_SEGMENTS}-seed-*")):
        model, _, c = load_model(ckpt)
        h = score_heads(model.eval())
        main_rows.append([ckpt.name, f"{c.step:,}", f"{h['best']['induction']:.2f}", f"{h['best']['previous']:.2f}",
                          "present" if h["best"]["induction"] > PRESENT else "not yet"])
    print(machine_line())
    print()
    print(f"model: d {D}, {HEADS} heads, {LAYERS} blocks, context {CONTEXT}, V {V:,} ({count_params(cfg):,} parameters; "
          f"positions {args.pos}, recipe {RECIPE} as the main job sets it), data {args.data}, batch {BATCH} × {CONTEXT} = {BATCH * CONTEXT} tokens a step, "
          f"{args.minutes:g} minutes a seed; heads scored at steps 0, 1, 2, 4, … and every "
          f"250 (andrea.heads: mean attention weight on BOS + r + r, r drawn from the {COMMON:,} most used segments, a kind "
          f"present above {PRESENT}). Loss fall: the "
          f"smoothed training loss's fall over the {WINDOW} steps before the crossing / the {WINDOW} after. "
          f"{time.time() - start:.0f} s in all ({'; '.join(notes)}).")
    print()
    print(md_table(["seed", "steps", "tokens", "induction > 0.3 at step", "best induction", "tokens then",
                    "previous-token then", "loss fall before / after", "at the end, r of every segment"], rows_out))
    if not main_rows:
        print()
        print("The main job's model: no final checkpoint in runs/main-corpus to score (the main job makes them).")
    if main_rows:
        print()
        print("The main job's model (15 minutes, batch 16 × 256), its final checkpoint:")
        print()
        print(md_table(["run", "step", "best induction", "best previous token", "induction"], main_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
