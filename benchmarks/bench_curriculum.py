"""The UCB1 curriculum against uniform sampling of sources, on the main job's data.

Two runs that differ only in how each step's source is chosen: `ucb` (the bandit of
andrea.curriculum) and `uniform` (every source equally likely, same re-roll schedule). Same model,
same seed, same step budget (or the same time budget with --minutes), the main job's recipe (v2,
batch 16 × 256, lr 2e-3) and the main job's cached tokenizer and shards. Afterwards, validation
bits per byte on the same fixed held-out windows of every source, and which sampling is lower
there. One seed per sampling: a small difference may be noise.

    .venv/bin/python benchmarks/bench_curriculum.py                         # andrea-cpu, 100 steps each
    .venv/bin/python benchmarks/bench_curriculum.py --steps 600             # a longer comparison
    .venv/bin/python benchmarks/bench_curriculum.py --preset andrea-tiny --steps 10   # a smoke check
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from common import machine_line, main_job_data, md_table, say

SAMPLINGS = ("ucb", "uniform")


def steps_per_source(run: Path) -> Counter:
    counts = Counter()
    with open(run / "metrics.jsonl") as f:
        for line in f:
            row = json.loads(line)
            if "source" in row:
                counts[row["source"]] += 1
    return counts


def main(argv=None) -> int:
    from andrea.config import PRESETS, count_params
    from andrea.errors import AndreaError
    from andrea.pipeline import RECIPE_SETTINGS, MainJob
    from andrea.train import train
    from andrea.trainconfig import TrainConfig

    job = MainJob()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default=job.preset, choices=list(PRESETS), help=f"model (default {job.preset})")
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps per run (default 100)")
    ap.add_argument("--minutes", type=float, help="minutes of training per run instead of a step count")
    ap.add_argument("--batch", type=int, default=job.batch_size, help=f"sequences per step (default {job.batch_size})")
    ap.add_argument("--seq", type=int, default=job.seq_len, help=f"tokens per sequence (default {job.seq_len}, at most the context)")
    ap.add_argument("--lr", type=float, default=RECIPE_SETTINGS["v2"]["lr"],
                    help=f"peak learning rate (default {RECIPE_SETTINGS['v2']['lr']:g})")
    ap.add_argument("--warmup", type=int, help="warmup steps (default a tenth of --steps, at most 50; 50 with --minutes)")
    ap.add_argument("--eval-windows", type=int, default=64, help="held-out windows per source (default 64)")
    ap.add_argument("--seed", type=int, default=job.seed, help=f"seed of both runs (default {job.seed})")
    ap.add_argument("--threads", type=int, help="torch threads (default torch's choice)")
    ap.add_argument("--out", type=Path, help="keep the two runs here (default a temporary folder, removed)")
    args = ap.parse_args(argv)

    cfg = PRESETS[args.preset]
    seq = min(args.seq, cfg.block_size)
    if args.minutes is None and args.steps < 1:
        ap.error("--steps must be at least 1.")
    warmup = args.warmup if args.warmup is not None else (50 if args.minutes else max(1, min(50, args.steps // 10)))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        data_dir = main_job_data(cfg.n_segments)
    except AndreaError as e:
        print(f"bench_curriculum: error: {e}", file=sys.stderr)
        return 2

    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory(prefix="andrea-curriculum-")
        root = Path(tmp.name)
    else:
        root = args.out
    results, counts = {}, {}
    try:
        for sampling in SAMPLINGS:
            run = root / sampling
            opts = TrainConfig(recipe="v2", batch_size=args.batch, seq_len=seq, lr=args.lr,
                               warmup_steps=warmup, max_steps=None if args.minutes else args.steps,
                               time_limit=args.minutes * 60 if args.minutes else None, eval_every=10**9,
                               checkpoint_every=10**9, eval_windows=args.eval_windows, seed=args.seed,
                               sampling=sampling, audit={"enabled": False})
            say(f"training {args.preset} with {sampling} sampling into {run}")
            results[sampling] = train(cfg, opts, data_dir, run, log=say, progress=sys.stderr.isatty())
            counts[sampling] = steps_per_source(run)
    except AndreaError as e:
        print(f"bench_curriculum: error: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp is not None:
            tmp.cleanup()

    ucb, uni = results["ucb"].eval, results["uniform"].eval
    names = [n for n in ucb if n != "all"]
    rows, wins = [], Counter()
    for name in names + ["all"]:
        a, b = ucb[name]["bpb"], uni[name]["bpb"]
        winner = "ucb" if a < b else "uniform" if b < a else "tie"
        if name != "all":
            wins[winner] += 1
        steps_cells = ([counts["ucb"][name], counts["uniform"][name]] if name != "all"
                       else [results["ucb"].step, results["uniform"].step])
        rows.append([f"**{name}**" if name == "all" else name, f"{a:.4f}", f"{b:.4f}", f"{a - b:+.4f}",
                     winner, *steps_cells, f"{ucb[name]['tokens']:,}"])

    budget = f"{args.minutes:g} min per run" if args.minutes else f"{args.steps:,} steps per run"
    print(f"## Curriculum: UCB1 against uniform source sampling, {args.preset}\n")
    print(f"machine: {machine_line()}\n")
    print(f"model {args.preset} ({count_params(cfg):,} parameters); data: the main job's shards `{data_dir}` "
          f"({', '.join(names)}); recipe v2, batch {args.batch} × {seq}, lr {args.lr:g}, warmup {warmup}, "
          f"seed {args.seed}; budget {budget}; audit off. Training time: ucb {results['ucb'].elapsed:.0f} s, "
          f"uniform {results['uniform'].elapsed:.0f} s.\n")
    print(md_table(["source", "val bits/byte, ucb", "val bits/byte, uniform", "ucb − uniform", "lower",
                    "steps on source, ucb", "steps on source, uniform", "held-out tokens"], rows, right={1, 2, 3, 5, 6, 7}))
    print()
    total = results["ucb"].eval["all"]["bpb"], results["uniform"].eval["all"]["bpb"]
    overall = "ucb" if total[0] < total[1] else "uniform" if total[1] < total[0] else "neither"
    tied = f", tied on {wins['tie']}" if wins["tie"] else ""
    print(f"Lower bits per byte: ucb on {wins['ucb']} of {len(names)} sources, uniform on {wins['uniform']}{tied}; "
          f"overall, {overall}. One run per sampling, one seed.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
