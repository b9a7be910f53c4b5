"""When does an induction head form? A small model watched while it trains.

Trains a 2-block model (d 64, 2 heads of 32, context 128, batch 4 × 128, the main job's recipe v3
with its own warm-up and decay) for a fixed number of minutes per seed, with snapshots on, so the
run scores what each head attends to at steps 0, 1, 2, 4, … and at every evaluation (andrea.inside.heads,
kept in metrics.jsonl; on sequences of the most used segments). Two heads a block, not four: an
induction head is one head doing one job, and with four narrower heads the copying spreads over
several of them. Reports per seed: the step and the tokens at which the best induction score
first passes 0.3 (or "not yet", with the best reached), the previous-token score there, and whether
the loss shows a bump: the smoothed training loss's fall over the WINDOW steps up to the crossing
against its fall over the WINDOW steps before those (an induction head brings a sudden fall, Olsson
et al. 2022; heads are scored every 250 steps, so the head formed somewhere in the window up to the
crossing; a bump where that fall is BUMP times the earlier one or more); and the final model's
best induction score on sequences drawn from every segment, rare ones included. Then the main
job's model, scored the same way (its runs predate the kept scores: the final checkpoint only).

The data (--data):
  repeats  (default) documents made from the main job's training text: a passage of 8 to 32 of its
           tokens, decoded, written three times in a row (BOS + p + p + p), prepared with the main
           job's tokenizer into runs/bench-induction/repeats-8-32; copying from context pays on two
           thirds of every document, as it does on the random sequences the heads are scored on.
           The longest passage is the scored r's length (andrea.inside.heads says why it is 32): a head
           learns the distances it is shown. In exploratory runs, with passages of 8 to 63 one seed
           formed no head in 13,650 steps; in a context of 64 with passages of 8 to 31, none in 10,000.
  main     the main job's shards as they are
The positions (--pos): `rope` (default) or `learned`, the family's own position table, which
must learn what "the token before" is before a previous-token head can form.

    .venv/bin/python benchmarks/bench_induction.py                   # 3 seeds × 12 minutes
    .venv/bin/python benchmarks/bench_induction.py --minutes 1 --seeds 1 --pos learned
    .venv/bin/python benchmarks/bench_induction.py --report          # the kept runs, reported again
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
from andrea.inside.heads import COMMON, PRESENT, score_heads, sequence_length
from andrea.mainjob_settings import MAIN_SEGMENTS, RECIPE_SETTINGS
from andrea.metrics import read_metrics
from andrea.prepare import prepare
from andrea.shards import open_token_data
from andrea.train import train
from andrea.trainconfig import TrainConfig

D, HEADS, LAYERS, CONTEXT, BATCH = 64, 2, 2, 128, 4
RECIPE = "v3"  # the main job's recipe, with its peak rate, warm-up and decay
# the repeats data: a passage of 8 to 32 tokens, three times; 32 is the n of the scored BOS + r + r
# (andrea.inside.heads), so that training shows a copy at every distance the heads are scored at
COPIES, SHORTEST, LONGEST, DOCS = 3, 8, sequence_length(CONTEXT), 150_000
WINDOW = 500  # steps of loss up to the crossing, compared with the WINDOW steps before them
DISTANCES = (8, 16, 32, 48, (CONTEXT - 1) // 2)  # r's lengths the final models are scored at, up to the context's
BUMP = 2.0  # the fall up to the crossing over the fall before it at which the loss shows a bump


def crossing(rows: list[dict]) -> tuple[int | None, float, int | None]:
    """(the first step whose best induction score passes PRESENT or None, the best reached, its step)."""
    scored = [(r["step"], r["heads"]["best"]["induction"]) for r in rows if "heads" in r]
    first = next((s for s, v in scored if v > PRESENT), None)
    step, best = max(scored, key=lambda sv: sv[1]) if scored else (None, float("nan"))
    return first, best, step


def loss_fall(rows: list[dict], step: int, window: int = WINDOW) -> tuple[float, float]:
    """How far the smoothed training loss fell over the `window` steps before `step - window`, and
    over the `window` steps up to `step`."""
    smma = {r["step"]: r["smma"] for r in rows if "smma" in r}
    at = lambda s: smma.get(min(max(s, min(smma)), max(smma)), math.nan)  # noqa: E731
    return at(step - 2 * window) - at(step - window), at(step - window) - at(step)


def bump(before: float, to: float) -> str:
    """Whether the loss fell BUMP times faster up to the crossing than before it."""
    return f"{to / before:.1f}× faster, a bump" if before > 0 and to >= BUMP * before else "no bump"


def repeats_data(data_dir: Path, out: Path, seed: int = 0) -> Path:
    """The repeats data (module docstring) in out/data, prepared once: DOCS passages drawn from each
    source of the main job's training split in proportion to its tokens, each written COPIES times."""
    if (out / "data" / "manifest.json").exists():
        return out / "data"
    data = open_token_data(data_dir)
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
    ap.add_argument("--d", type=int, default=D, help=f"model width (default {D})")
    ap.add_argument("--heads", type=int, default=HEADS, help=f"heads a block, each d/heads wide (default {HEADS})")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench-induction")
    ap.add_argument("--report", action="store_true",
                    help="report the runs kept in --out for these seeds and settings, without training again")
    args = ap.parse_args()
    try:
        data_dir = main_job_data(MAIN_SEGMENTS)
        if args.data == "repeats":
            data_dir = repeats_data(data_dir, args.out / f"repeats-{SHORTEST}-{LONGEST}")
        V = open_token_data(data_dir).vocab_size
    except AndreaError as e:
        print(f"bench_induction: {e}", file=sys.stderr)
        return 2
    cfg = ModelConfig(vocab_size=V, n_embd=args.d, n_head=args.heads, n_layer=LAYERS, block_size=CONTEXT, pos=args.pos)
    rows_out, notes, minutes = [], [], set()
    start = time.time()
    for seed in args.seeds:
        run = args.out / f"{args.data}-{args.pos}-d{args.d}h{args.heads}-seed-{seed}"
        if args.report:
            if not (run / "metrics.jsonl").exists():
                print(f"bench_induction: no kept run {run} to report; run without --report to train it.", file=sys.stderr)
                return 2
            kept = json.loads((run / "train.json").read_text())["train"]["time_limit"] / 60
            notes.append(f"seed {seed}: kept run")
            minutes.add(f"{kept:g}")
        else:
            say(f"seed {seed}: training for {args.minutes:g} minutes into {run}")
            shutil.rmtree(run, ignore_errors=True)  # a fresh run each call
            tc = TrainConfig(batch_size=BATCH, micro_batch=BATCH, seq_len=CONTEXT, max_steps=10**9,
                             time_limit=args.minutes * 60, eval_every=250, eval_windows=8, checkpoint_every=10**9,
                             seed=seed, audit={"enabled": False}, recipe=RECIPE, **RECIPE_SETTINGS[RECIPE])
            t0 = time.time()
            train(cfg, tc, data_dir, run, log=say, progress=False, resume=False)
            notes.append(f"seed {seed}: {time.time() - t0:.0f} s")
            minutes.add(f"{args.minutes:g}")
        rows = read_metrics(run / "metrics.jsonl")
        steps = max(r["step"] for r in rows if "loss" in r)
        first, best, best_step = crossing(rows)
        prev = next((r["heads"]["best"]["previous"] for r in rows if "heads" in r and r["step"] == first), None)
        model, _, _ = load_model(run)
        every = score_heads(model.eval(), common=None)["best"]["induction"]
        by_length = " / ".join(f"{score_heads(model, n=n)['best']['induction']:.2f}" for n in DISTANCES)
        if first is None:
            rows_out.append([seed, f"{steps:,}", f"{steps * BATCH * CONTEXT / 1e6:.2f} M", "not yet",
                             f"{best:.2f} (step {best_step:,})", "", "", "", f"{every:.2f}", by_length])
            continue
        before, to = loss_fall(rows, first)
        rows_out.append([seed, f"{steps:,}", f"{steps * BATCH * CONTEXT / 1e6:.2f} M", f"{first:,}",
                         f"{best:.2f} (step {best_step:,})", f"{first * BATCH * CONTEXT / 1e6:.2f} M",
                         f"{prev:.2f}", f"{before:.3f} / {to:.3f}: " + bump(before, to),
                         f"{every:.2f}", by_length])
    main_rows = []
    for ckpt in sorted((REPO / "runs" / "main-corpus").glob(f"segments-{MAIN_SEGMENTS}-seed-*")):
        model, _, c = load_model(ckpt)
        h = score_heads(model.eval())
        main_rows.append([ckpt.name, f"{c.step:,}", f"{h['best']['induction']:.2f}", f"{h['best']['previous']:.2f}",
                          "present" if h["best"]["induction"] > PRESENT else "not yet"])
    print(machine_line())
    print()
    print(f"model: d {args.d}, {args.heads} heads, {LAYERS} blocks, context {CONTEXT}, V {V:,} ({count_params(cfg):,} parameters; "
          f"positions {args.pos}, recipe {RECIPE} as the main job sets it), data {args.data}, batch {BATCH} × {CONTEXT} = {BATCH * CONTEXT} tokens a step, "
          f"{' or '.join(sorted(minutes))} minutes a seed; heads scored at steps 0, 1, 2, 4, … and every "
          f"250 (andrea.inside.heads: mean attention weight on BOS + r + r, r drawn from the {COMMON:,} most used segments, a kind "
          f"present above {PRESENT}; r of {LONGEST} tokens, the longest distance between copies in training). Loss fall: the "
          f"smoothed training loss's fall over {WINDOW} steps / over the {WINDOW} up to the crossing (a bump at {BUMP:g}× or more). "
          f"{time.time() - start:.0f} s in all ({'; '.join(notes)}).")
    print()
    print(md_table(["seed", "steps", "tokens", "induction > 0.3 at step", "best induction", "tokens then",
                    "previous-token then", "loss fall before / up to it", "at the end, r of every segment",
                    "at the end, r of " + " / ".join(map(str, DISTANCES)) + " tokens"], rows_out))
    if not main_rows:
        print()
        print("The main job's model: no final checkpoint in runs/main-corpus to score (the main job makes them).")
    if main_rows:
        print()
        print("The main job's model (15 minutes), its final checkpoint:")
        print()
        print(md_table(["run", "step", "best induction", "best previous token", "induction"], main_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
