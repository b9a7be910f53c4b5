"""Source sampling compared on the main job's data: the UCB1 curriculum (ANDREA's reward, and the
"progress" and "abs-progress" rewards), uniform, and token-proportional.

Runs that differ only in how each step's source is chosen: `ucb` (the bandit of andrea.curriculum
with ANDREA's reward), `ucb-progress` (the same bandit with reward "progress": learning progress
against each source's own recent level), `ucb-abs-progress` (reward "abs-progress": the size of
that progress, so forgetting counts too), `uniform` (every source equally likely, same re-roll
schedule) and `proportional` (by token count, no curriculum). Same model, same seeds, same step
budget (or the same time budget with --minutes), the main job's recipe and batch (--recipe, with
its settings of andrea.mainjob_settings.RECIPE_SETTINGS) and its cached tokenizer and shards. Afterwards,
validation bits per byte on the same fixed held-out windows of every source: per source and
overall, the mean over seeds and, with several seeds, the spread. The runs go seed by seed, arm after arm, so compared arms ran side by side.

    .venv/bin/python benchmarks/bench_curriculum.py                         # andrea-cpu, 100 steps, 1 seed
    .venv/bin/python benchmarks/bench_curriculum.py --minutes 15 --seeds 3  # the main job's budget
    .venv/bin/python benchmarks/bench_curriculum.py --preset andrea-tiny --steps 10   # a smoke check

With --out, each finished run leaves its figures in bench_result.json, and a later call with the
same --out and settings reuses them instead of training again: the comparison can be run a seed
at a time (--seed S --seeds 1), each seed's arms side by side, and its table printed whole at the
end by the full command. A run folder without that file (a run that was stopped) is trained anew.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from common import machine_line, main_job_data, md_table, read_result, say, stopped_by_signal, write_result

ARMS = {"ucb": ("ucb", "andrea"), "ucb-progress": ("ucb", "progress"), "ucb-abs-progress": ("ucb", "abs-progress"),
        "uniform": ("uniform", "andrea"), "proportional": ("proportional", "andrea")}


def step_losses(run: Path) -> list[tuple[str, float]]:
    """(source, loss) of every training step of a run, in order (from its metrics.jsonl)."""
    from andrea.metrics import read_metrics

    return [(row["source"], row["loss"]) for row in read_metrics(run / "metrics.jsonl") if "source" in row]


def reward_anatomy(steps: list[tuple[str, float]], names: list[str]) -> dict[str, dict[str, float]]:
    """What ANDREA's reward paid each source for, replayed from a run's (source, loss) steps with
    andrea.curriculum's own formula: the mean reward over the whole run and over its last two
    thirds; there, the noise of a batch's loss around the source's EMA (its standard deviation) and
    the progress (how far the EMA fell per pull). Units: the reward's, milli-nats (loss × 1000)."""
    from andrea.curriculum import REWARD_SCALE, reward_and_ema

    ema, seen = {}, {n: [] for n in names}
    for i, (source, loss) in enumerate(steps):
        reward, after = reward_and_ema(ema.get(source), loss)
        seen[source].append((i >= len(steps) // 3, reward, loss - ema.get(source, loss), after))
        ema[source] = after
    out = {}
    for name, rows in seen.items():
        late = [r for r in rows if r[0]]
        if len(late) < 2:
            continue
        out[name] = {"pulls": len(rows), "reward": statistics.fmean(r[1] for r in rows),
                     "late": statistics.fmean(r[1] for r in late),
                     "noise": REWARD_SCALE * statistics.pstdev(r[2] for r in late),
                     "progress": REWARD_SCALE * (late[0][3] - late[-1][3]) / (len(late) - 1)}
    return out


def shares_by_part(sources: list[str], names: list[str], parts: int = 3) -> list[dict[str, float]]:
    """The share of each source among the steps of each of `parts` equal spans of a run, in order."""
    n = len(sources)
    out = []
    for k in range(parts):
        span = Counter(sources[k * n // parts:(k + 1) * n // parts])
        total = max(1, sum(span.values()))
        out.append({name: span[name] / total for name in names})
    return out


def main(argv=None) -> int:
    from andrea.config import PRESETS, count_params
    from andrea.errors import AndreaError
    from andrea.mainjob import MainJob
    from andrea.mainjob_settings import MAIN_RECIPE, RECIPE_SETTINGS
    from andrea.train import train
    from andrea.trainconfig import RECIPES, TrainConfig

    job = MainJob.on("cpu")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default=job.preset, choices=list(PRESETS), help=f"model (default {job.preset})")
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps per run (default 100)")
    ap.add_argument("--minutes", type=float, help="minutes of training per run instead of a step count")
    ap.add_argument("--batch", type=int, default=job.batch_size, help=f"sequences per step (default {job.batch_size})")
    ap.add_argument("--seq", type=int, default=job.seq_len, help=f"tokens per sequence (default {job.seq_len}, at most the context)")
    ap.add_argument("--recipe", choices=list(RECIPES), default=MAIN_RECIPE, help=f"training recipe (default {MAIN_RECIPE}, the main job's)")
    ap.add_argument("--lr", type=float, help="peak learning rate (default the recipe's, as the main job runs it)")
    ap.add_argument("--warmup", type=int, help="warmup steps (default a tenth of --steps, at most 50; 50 with --minutes)")
    ap.add_argument("--eval-windows", type=int, default=64, help="held-out windows per source (default 64)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per arm (default 1)")
    ap.add_argument("--seed", type=int, default=job.seed, help=f"the first seed (default {job.seed})")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="which samplings (default all)")
    ap.add_argument("--threads", type=int, help="torch threads (default torch's choice)")
    ap.add_argument("--brief", action="store_true", help="print the comparison only, without the tables of where each "
                                                          "sampling spent its steps and what ANDREA's reward paid for")
    ap.add_argument("--out", type=Path, help="keep the runs here (default a temporary folder, removed)")
    args = ap.parse_args(argv)

    cfg = PRESETS[args.preset]
    seq = min(args.seq, cfg.block_size)
    if args.minutes is None and args.steps < 1:
        ap.error("--steps must be at least 1.")
    settings = {**RECIPE_SETTINGS[args.recipe]}
    recipe_lr = settings.pop("lr", None)
    settings.pop("warmup_steps", None)  # --warmup's default depends on the budget
    lr = args.lr if args.lr is not None else recipe_lr
    warmup = args.warmup if args.warmup is not None else (50 if args.minutes else max(1, min(50, args.steps // 10)))
    import torch

    if args.threads:
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
    seeds = list(range(args.seed, args.seed + args.seeds))
    results, counts, drawn = {}, {}, {}  # drawn: each run's (source, loss) per step, where its metrics are still there
    reused = []  # runs measured by an earlier call with the same --out and settings
    try:
        for seed in seeds:
            for arm in args.arms:
                sampling, reward = ARMS[arm]
                run = root / f"{arm}-seed{seed}"
                opts = TrainConfig(recipe=args.recipe, batch_size=args.batch, seq_len=seq, lr=lr, **settings,
                                   warmup_steps=warmup, max_steps=None if args.minutes else args.steps,
                                   time_limit=args.minutes * 60 if args.minutes else None, eval_every=10**9,
                                   checkpoint_every=10**9, eval_windows=args.eval_windows, seed=seed,
                                   sampling=sampling, curriculum={"reward": reward}, audit={"enabled": False})
                plan = {"preset": args.preset, "options": opts.to_dict(), "data": str(data_dir),
                        "threads": torch.get_num_threads()}
                kept = read_result(run, plan)
                if kept is not None and kept.get("eval") is None:
                    kept = None  # written by an older version for a run a signal stopped: train it anew
                if kept is not None:  # measured by an earlier call with the same --out and settings
                    reused.append(f"{arm} (seed {seed})")
                    say(f"{arm} sampling, seed {seed}: kept from {run}: {kept['eval']['all']['bpb']:.4f} bits/byte")
                    results[arm, seed] = SimpleNamespace(eval=kept["eval"], step=kept["step"])
                    counts[arm, seed] = Counter(kept["counts"])
                    drawn[arm, seed] = step_losses(run) if (run / "metrics.jsonl").exists() else None
                    continue
                if run.exists():
                    shutil.rmtree(run)  # a run that stopped before its figures were written
                say(f"training {args.preset} with {arm} sampling, seed {seed}, into {run}")
                results[arm, seed] = train(cfg, opts, data_dir, run, log=say, progress=sys.stderr.isatty())
                if stopped_by_signal("bench_curriculum", results[arm, seed], f"{arm}, seed {seed}", args.out is not None):
                    return 130
                drawn[arm, seed] = step_losses(run)
                counts[arm, seed] = Counter(source for source, _ in drawn[arm, seed])
                if args.out is not None:
                    write_result(run, plan, {"eval": results[arm, seed].eval, "step": results[arm, seed].step,
                                             "counts": counts[arm, seed]})
    except AndreaError as e:
        print(f"bench_curriculum: error: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp is not None:
            tmp.cleanup()

    first = results[args.arms[0], seeds[0]].eval
    names = [n for n in first if n != "all"]

    def cell(arm, name):
        got = [results[arm, s].eval[name]["bpb"] for s in seeds]
        mean = statistics.fmean(got)
        return mean, (f"{mean:.4f} ± {statistics.stdev(got):.4f}" if len(got) > 1 else f"{mean:.4f}")

    rows, best = [], Counter()
    for name in names + ["all"]:
        cells = {arm: cell(arm, name) for arm in args.arms}
        low = min(args.arms, key=lambda a: cells[a][0])
        if name != "all":
            best[low] += 1
        steps = [f"{statistics.fmean(counts[a, s][name] for s in seeds):,.0f}" if name != "all"
                 else f"{statistics.fmean(results[a, s].step for s in seeds):,.0f}" for a in args.arms]
        rows.append([f"**{name}**" if name == "all" else name, *(cells[a][1] for a in args.arms), low, *steps])

    budget = f"{args.minutes:g} min per run" if args.minutes else f"{args.steps:,} steps per run"
    print(f"## Curriculum: source sampling compared, {args.preset}\n")
    print(f"machine: {machine_line()}\n")
    print(f"model {args.preset} ({count_params(cfg):,} parameters); data: the main job's shards `{data_dir}` "
          f"({', '.join(names)}); recipe {args.recipe} {json.dumps(settings)}, batch {args.batch} × {seq}, "
          f"lr {opts.resolved_lr():g}, warmup {warmup}, "
          f"seeds {', '.join(map(str, seeds))}; budget {budget}; audit off. Cells: validation bits per byte, the mean "
          f"over seeds{' ± the standard deviation' if len(seeds) > 1 else ''}; steps: mean steps on the source.\n")
    print(md_table(["source", *args.arms, "lowest", *(f"steps, {a}" for a in args.arms)], rows,
                   right=set(range(1, 1 + len(args.arms))) | set(range(2 + len(args.arms), 2 + 2 * len(args.arms)))))
    print()
    overall = {a: cell(a, "all")[0] for a in args.arms}
    order = sorted(args.arms, key=overall.get)
    # how each sampling spent its steps over the run: where a bandit moves weight, and when
    shares = {}
    for a in args.arms:
        if all(drawn[a, s] for s in seeds):
            per_seed = [shares_by_part([source for source, _ in drawn[a, s]], names) for s in seeds]
            shares[a] = [{n: statistics.fmean(p[k][n] for p in per_seed) for n in names} for k in range(3)]
    if shares and not args.brief:
        print("Share of steps per source in the first, middle and last third of each run (mean over seeds):\n")
        rows = [[a, *("/".join(f"{100 * shares[a][k][n]:.0f}" for k in range(3)) for n in names)] for a in shares]
        print(md_table(["sampling", *(f"{n} (%)" for n in names)], rows))
        print()
    if "ucb" in args.arms and all(drawn["ucb", s] for s in seeds) and not args.brief:
        per_seed = [reward_anatomy(drawn["ucb", s], names) for s in seeds]
        keys = ("pulls", "reward", "late", "noise", "progress")
        rows = [[n, *(f"{statistics.fmean(p[n][k] for p in per_seed):,.{0 if k == 'pulls' else 1}f}" for k in keys)]
                for n in names if all(n in p for p in per_seed)]
        print("What ANDREA's reward paid for in the ucb runs, replayed from their losses (mean over seeds; "
              "milli-nats): the mean reward over the whole run and over its last two thirds, and there the "
              "noise of a batch's loss around the source's EMA (standard deviation) and the progress (the "
              "EMA's fall per pull):\n")
        print(md_table(["source", "pulls", "mean reward", "mean reward, last 2/3", "loss noise, last 2/3",
                        "progress per pull, last 2/3"], rows))
        print()
    if reused:
        print(f"Runs kept from an earlier call with the same settings in {args.out}: {', '.join(reused)}.\n")
    print("Lowest bits per byte per source: " + ", ".join(f"{a} on {best[a]}" for a in args.arms) + f" of {len(names)}; "
          f"overall, in order: {', '.join(f'{a} {overall[a]:.4f}' for a in order)}. "
          + ("One seed per arm: a small difference may be noise." if len(seeds) == 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
