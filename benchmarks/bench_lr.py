"""The main job's peak learning rate at a fixed step budget: validation bits per byte for each lr.

Runs `bench_curriculum.py --arms ucb` once per learning rate, with the main job's model, recipe,
batch, data and UCB1 curriculum, so the runs differ only in their peak lr. A step budget (not
minutes) makes the figure independent of the machine's speed and load. Each lr keeps its runs in
OUT/lr-LR, so a later call with the same --out and settings reuses them; then one table compares
the rates: validation bits per byte on the same held-out windows of every source, the mean over
seeds and its spread.

    .venv/bin/python benchmarks/bench_lr.py                          # 3e-3 6e-3 1.2e-2, 300 steps, 2 seeds
    .venv/bin/python benchmarks/bench_lr.py --lrs 6e-3 1.2e-2 --steps 100 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from common import RESULT_FILE, md_table

HERE = Path(__file__).resolve().parent


def runs_of(folder: Path, seeds: list[int]) -> dict[int, dict]:
    """{seed: the figures bench_curriculum left for its ucb run of that seed}."""
    out = {}
    for seed in seeds:
        path = folder / f"ucb-seed{seed}" / RESULT_FILE
        out[seed] = json.loads(path.read_text())
    return out


def mean_sd(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{mean:.4f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lrs", nargs="+", default=["3e-3", "6e-3", "1.2e-2"], help="peak learning rates (default 3e-3 6e-3 1.2e-2)")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per rate (default 2)")
    ap.add_argument("--seed", type=int, default=1337, help="the first seed (default 1337)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-lr"), help="where the runs are kept (default runs/bench-lr)")
    args = ap.parse_args(argv)
    try:
        lrs = [float(x) for x in args.lrs]
    except ValueError:
        ap.error("--lrs takes numbers, such as 6e-3.")
    seeds = list(range(args.seed, args.seed + args.seeds))
    table = {}
    for text, lr in zip(args.lrs, lrs):
        folder = args.out / f"lr-{text}"
        cmd = [sys.executable, str(HERE / "bench_curriculum.py"), "--arms", "ucb", "--steps", str(args.steps),
               "--seed", str(args.seed), "--seeds", str(args.seeds), "--lr", text, "--threads", str(args.threads),
               "--out", str(folder)]
        print(f"bench_lr: lr {lr:g}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        if done.returncode != 0:
            print(f"bench_lr: bench_curriculum.py failed for lr {lr:g} (exit {done.returncode}).", file=sys.stderr)
            return done.returncode
        table[lr] = runs_of(folder, seeds)

    first = next(iter(next(iter(table.values())).values()))
    names = [n for n in first["eval"] if n != "all"]
    recipe = first["options"]["recipe"]
    rows = []
    for lr, runs in table.items():
        overall = [runs[s]["eval"]["all"]["bpb"] for s in seeds]
        rows.append([f"{lr:g}", *(f"{v:.4f}" for v in overall), mean_sd(overall),
                     *(f"{statistics.fmean(runs[s]['eval'][n]['bpb'] for s in seeds):.3f}" for n in names)])
    best = min(table, key=lambda lr: statistics.fmean(table[lr][s]["eval"]["all"]["bpb"] for s in seeds))
    print(f"model {first['preset']}, recipe {recipe}, batch {first['options']['batch_size']} × "
          f"{first['options']['seq_len']}, UCB1 curriculum (ANDREA's reward), {args.steps:,} steps per run "
          f"(warm-up {first['options']['warmup_steps']}, decay over the last {first['options']['decay_fraction']:.0%}), "
          f"torch threads {first['threads']}; data `{first['data']}`. Cells: validation bits per byte on the same "
          f"held-out windows of every source (lower is better); by source: the mean over seeds.\n")
    print(md_table(["peak lr", *(f"seed {s}" for s in seeds), "mean ± sd", *names], rows))
    print(f"\nLowest mean: lr {best:g}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
