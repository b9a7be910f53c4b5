"""The main job's vocabulary at equal wall time: segment counts side by side on the default corpus.

For every segment count (`--segments`), the main job is run as `andrea main --segments N` runs it
(the default corpus, its tokenizer fitted with an equal share per source, andrea-cpu's body at
d 256 with V = N + 257, recipe v3, the same seed) for the same `--minutes` of training, one after
the other, so each count gets the same wall time on the same machine. Printed per count: the
model's parameters, the steps and tokens per second it reached, validation bits per byte (all
sources and each; bits per byte do not depend on the vocabulary), the share of SimLex-999's and
WordSim-353's words that are single tokens in their word-initial form, the lesson's words that
are, and the word-similarity scores of the centred input table (all pairs; n and null spread in
the JSON) with the lesson's cos(␣cat, ␣dog) − cos(␣cat, ␣Tuesday) against 3/√d.

    .venv/bin/python benchmarks/bench_vocab.py                               # 4096 6144 8192, 6 min each
    .venv/bin/python benchmarks/bench_vocab.py --segments 6144 8192 --minutes 3 --out runs/vocab
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from common import load_average, machine_line, md_table, say


def scores(checkpoint: str) -> dict:
    """Coverage and the centred input table's scores of a trained checkpoint."""
    from andrea.checkpoint import load_model
    from andrea.wordsim import LESSON_WORDS, load_wordsets, model_tables, similarity, word_index

    model, tok, _ = load_model(checkpoint)
    sets = load_wordsets()
    index = word_index(tok, model.config.vocab_size, sets)
    report = similarity(model_tables(model), index, sets, analogies=False)
    inp = report.tables["input"]["centred"]
    gap = inp["lesson"]["cat·dog"]["cos"] - inp["lesson"]["cat·Tuesday"]["cos"]
    return {"coverage": report.coverage, "lesson_single": [w for w in LESSON_WORDS if index.single(w)],
            "simlex": inp["simlex999"]["all"], "wordsim": inp["wordsim353"]["all"], "gap": gap,
            "band": 3 / math.sqrt(report.d), "lesson": inp["lesson"]}


def run_one(n: int, args, out: Path) -> dict:
    from dataclasses import replace

    from andrea.config import N_SPECIAL, count_params, get_preset
    from andrea.pipeline import MainJob, run_main_job

    done = out / f"segments-{n}" / "bench_vocab.json"
    if done.exists():
        say(f"{n:,} segments: reusing {done}")
        return json.loads(done.read_text())
    job = MainJob.on("cpu", minutes=args.minutes, seed=args.seed, segments=n, out=out / f"segments-{n}", samples=1)
    load = load_average()
    summary = run_main_job(job, log=say)
    params = count_params(replace(get_preset(job.preset), vocab_size=n + N_SPECIAL))
    r = {"segments": n, "params": params, "load": load, **{k: summary[k] for k in (
        "steps", "tokens_per_s", "val_bpb", "val_bpb_by_source", "best_val_bpb", "train_seconds", "best_checkpoint")},
        **scores(summary["best_checkpoint"])}
    done.write_text(json.dumps(r, indent=2) + "\n")
    return r


def main(argv=None) -> int:
    from andrea.errors import AndreaError

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segments", nargs="+", type=int, default=[4096, 6144, 8192], help="segment counts (default 4096 6144 8192)")
    ap.add_argument("--minutes", type=float, default=6.0, help="minutes of training each (default 6)")
    ap.add_argument("--seed", type=int, default=1337, help="seed (default 1337)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-vocab"), help="the runs' folder (default runs/bench-vocab); "
                    "a count whose run finished there is reused")
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        results = [run_one(n, args, args.out) for n in args.segments]
    except AndreaError as e:
        print(f"bench_vocab: {e}", file=sys.stderr)
        return 2
    rows = []
    for r in results:
        cov = r["coverage"]
        share = {k: f"{c['single_token_words'] / c['words']:.0%}" for k, c in cov.items()}
        by = ", ".join(f"{k} {v:.3f}" for k, v in r["val_bpb_by_source"].items())
        rows.append([f"{r['segments']:,}", f"{r['segments'] + 257:,}", f"{r['params']:,}", f"{r['steps']:,}",
                     f"{r['tokens_per_s']:,.0f}", f"{r['val_bpb']:.4f}", by, share["simlex999"], share["wordsim353"],
                     " ".join(r["lesson_single"]) or "-", f"{r['simlex']['rho']:+.3f}", f"{r['wordsim']['rho']:+.3f}",
                     f"{r['gap']:+.3f} (3/√d {r['band']:.3f})", r["load"]])
    print("## The main job's vocabulary at equal wall time (`bench_vocab.py`)\n")
    print(machine_line() + "\n")
    print(f"`andrea main --segments N --minutes {args.minutes:g} --seed {args.seed}` for each N, one after the other "
          f"({(time.time() - t0) / 60:.0f} min in all, this call); andrea-cpu's body (d 256, 4 layers, 8 heads), "
          f"V = N + 257. Validation: bits per byte on every source's held-out windows. Single: the share of the "
          f"set's words that are one token in their word-initial form. ρ: Spearman, all pairs, centred input table. "
          f"Lesson gap: cos(␣cat, ␣dog) − cos(␣cat, ␣Tuesday), centred input table.\n")
    print(md_table(["segments", "V", "parameters", "steps", "tokens/s", "val bpb", "by source", "SimLex single",
                    "WordSim single", "lesson words single", "SimLex ρ", "WordSim ρ", "lesson gap", "load at start"],
                   rows, right={0, 1, 2, 3, 4, 5, 10, 11}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
