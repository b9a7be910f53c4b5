"""Word vectors from the blocks of the main job's model, block by block, beside the tables and counting.

For each run (default: the main job's 3 seeds, runs/main-corpus/segments-N-seed-*): a word's hidden
state after each block at its last token, averaged over up to 16 uses in the training text
(andrea.inside.context_vectors), centred; Spearman ρ on SimLex-999 and WordSim-353 over the pairs whose
two words have at least 4 uses (words of several tokens included), beside the centred input table,
the output head and PPMI counts of the same training tokens on the same pairs. Then the best block
per seed and the mean over seeds.

    .venv/bin/python benchmarks/bench_layers.py
    .venv/bin/python benchmarks/bench_layers.py --checkpoint runs/a runs/b
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from common import REPO, machine_line, md_table, say

from andrea.checkpoint import load_model
from andrea.errors import AndreaError
from andrea.inside.context_vectors import CONTEXT, MIN_USES, USES, best_layer, block_vectors, layer_scores
from andrea.inside.wordsim import PAIR_SETS, load_wordsets, model_tables, ppmi_vectors, train_token_chunks
from andrea.mainjob_settings import MAIN_SEGMENTS
from andrea.usage import run_data

NAMES = {"input": "input table (wte)", "output": "output head (lm_head)", "ppmi": "PPMI + SVD, same tokens"}
SET_NAMES = {"simlex999": "SimLex", "wordsim353": "WordSim"}


def default_runs() -> list[Path]:
    return sorted((REPO / "runs" / "main-corpus").glob(f"segments-{MAIN_SEGMENTS}-seed-*"))


def score_run(run: Path, sets, ppmi_cache: dict) -> tuple[dict, int]:
    model, tok, ckpt = load_model(run)
    data, why = run_data(run, model.config.vocab_size)
    if data is None:
        raise AndreaError(f"{run}: {why}.")
    bv = block_vectors(model.eval(), tok, data, {w for p in sets.pairs.values() for a, b, _ in p for w in (a, b)},
                       log=say)
    tables = model_tables(model)
    if data.dir not in ppmi_cache:
        say(f"counting co-occurrences in {data.dir} for the PPMI reference")
        ppmi_cache[data.dir] = ppmi_vectors(train_token_chunks(data), model.config.vocab_size, model.config.n_embd)
    tables["ppmi"] = ppmi_cache[data.dir]
    return layer_scores(bv, tok, sets, tables), int(ckpt.meta.get("step", 0))


def cell(s: dict) -> float:
    return s["rho"] if s["n"] > 2 and math.isfinite(s["rho"]) else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", nargs="+", type=Path, help="run folders (default: the main job's seeds)")
    args = ap.parse_args()
    runs = args.checkpoint or default_runs()
    if not runs:
        print(f"bench_layers: no runs/main-corpus/segments-{MAIN_SEGMENTS}-seed-* here; run `benchmarks/run_all --only "
              "mainjob_seeds` first, or give --checkpoint.", file=sys.stderr)
        return 2
    start = time.time()
    try:
        sets = load_wordsets()
        cache: dict = {}
        scored = [(run, *score_run(run, sets, cache)) for run in runs]
    except AndreaError as e:
        print(f"bench_layers: {e}", file=sys.stderr)
        return 2
    print(machine_line())
    print()
    first = scored[0][1]
    print(f"{len(runs)} runs; a word's vector from block l: its hidden state after block l at its last token, the mean "
          f"over up to {USES} uses in the run's training text (windows of {CONTEXT} tokens), centred over the words; "
          f"pairs: those whose two words both have at least {MIN_USES} uses (words of several tokens included); "
          f"the tables: a word's token rows' mean, the table centred on its mean row. ρ: Spearman; ± after a mean: the "
          f"standard deviation over runs. {time.time() - start:.0f} s in all.")
    print()
    for s in PAIR_SETS:
        part = first["sets"][s]
        print(f"- {SET_NAMES[s]}: {part['pairs']} of {part['of']} pairs ({part['with_several_tokens']} with a word of "
              f"several tokens), null spread ±{next(iter(part['scores'].values()))['null']:.3f}")
    print()
    names = list(first["sets"][PAIR_SETS[0]]["scores"])
    seeds = [run.name.rsplit("-", 1)[-1] if "seed" in run.name else run.name for run, _, _ in scored]
    headers = ["vectors"] + [f"{SET_NAMES[s]} ρ, {seed}" for s in PAIR_SETS for seed in seeds] + \
              [f"{SET_NAMES[s]} ρ, mean" for s in PAIR_SETS]
    rows = []
    for name in names:
        row = [NAMES.get(name, name)]
        means = []
        for s in PAIR_SETS:
            vals = [cell(r["sets"][s]["scores"][name]) for _, r, _ in scored]
            row += [f"{v:+.3f}" for v in vals]
            means.append(f"{np.mean(vals):+.3f} ± {np.std(vals):.3f}" if len(vals) > 1 else f"{vals[0]:+.3f}")
        rows.append(row + means)
    print(md_table(headers, rows))
    print()
    for run, r, step in scored:
        best = {s: best_layer(r, s) for s in PAIR_SETS}
        print(f"- {run.name} (step {step:,}): best block on SimLex {best['simlex999'][0]} ({best['simlex999'][1]:+.3f}), "
              f"on WordSim {best['wordsim353'][0]} ({best['wordsim353'][1]:+.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
