"""Word similarity of a trained model beside counting: SimLex-999, WordSim-353, analogies, the lesson.

For the run's input table (wte) and output head (lm_head), raw and centred, and for the classic
count-based reference on the same training tokens (PPMI of ±2-token co-occurrences reduced by SVD
to d dimensions, `andrea.inside.wordsim.ppmi_vectors`): Spearman ρ with n and the null spread
1/√(n − 1), 3CosAdd accuracy, the mean cosine between rows, the lesson's cat·dog against
cat·Tuesday. Then the same over the run's snapshots (the table learning), and what the snapshots
and scores cost the run: the seconds the trainer's own timer counted, against its training time,
and the disk they take.

    .venv/bin/python benchmarks/bench_similarity.py                         # the newest runs/main-*
    .venv/bin/python benchmarks/bench_similarity.py --checkpoint runs/x [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from common import machine_line, md_table
from embedding_pairs import newest_main_checkpoint

from andrea.errors import AndreaError
from andrea.inside.embed import load_subject
from andrea.inside.wordsim import LESSON_WORDS, load_wordsets, model_tables, ppmi_vectors, similarity, train_token_chunks, word_index
from andrea.metrics import read_metrics
from andrea.shards import open_token_data

NAMES = {"input": "model, input table (wte)", "output": "model, output head (lm_head)", "ppmi": "PPMI + SVD, same tokens"}


def rho_cell(s: dict) -> str:
    if s["n"] < 3 or not math.isfinite(s["rho"]):
        return f"n/a (n {s['n']})"
    return f"{s['rho']:+.3f} (n {s['n']}, null ±{s['null']:.3f})"


def score_rows(report: dict) -> list[list]:
    rows = []
    for table, parts in report["tables"].items():
        for how, s in parts.items():
            a = s["analogies"]
            acc = "n/a" if not math.isfinite(a["accuracy"]) else f"{100 * a['accuracy']:.1f}% (n {a['n']})"
            rows.append([NAMES[table], how, rho_cell(s["simlex999"]["single"]), rho_cell(s["simlex999"]["all"]),
                         rho_cell(s["wordsim353"]["single"]), rho_cell(s["wordsim353"]["all"]), acc,
                         f"{s['mean_cos']:+.3f}", f"{s['lesson']['cat·dog']['cos']:+.3f}",
                         f"{s['lesson']['cat·Tuesday']['cos']:+.3f}"])
    return rows


def verdict(report: dict) -> list[str]:
    """The network against counting, on the centred tables, set by set (all pairs)."""
    lines = []
    for name in ("simlex999", "wordsim353"):
        m = report["tables"]["input"]["centred"][name]["all"]
        p = report["tables"]["ppmi"]["centred"][name]["all"]
        gap = m["rho"] - p["rho"]
        word = "above" if gap > 0 else "below"
        lines.append(f"{name}, all {m['n']} pairs, centred: the model's input table ρ {m['rho']:+.3f}, the PPMI "
                     f"reference {p['rho']:+.3f}: the network is {abs(gap):.3f} {word} counting "
                     f"({abs(gap) / m['null']:.1f} null spreads).")
    return lines


def cost(run: Path) -> str:
    rows = read_metrics(run / "metrics.jsonl")
    spent = [r["growth_seconds"] for r in rows if "growth_seconds" in r]
    trained = [r["time"] for r in rows if "time" in r]
    disk = sum(p.stat().st_size for p in (run / "embeddings").glob("*.safetensors"))
    n = len(list((run / "embeddings").glob("*.safetensors")))
    if not spent or not trained:
        return f"the run's metrics hold no snapshot timing; {n} snapshots take {disk / 1e6:.1f} MB."
    return (f"snapshots and similarity scores took {spent[-1]:.2f} s of the run's {trained[-1]:.0f} s of training "
            f"({100 * spent[-1] / trained[-1]:.2f}%, the trainer's own timer, as of its last evaluation); "
            f"{n} snapshots take {disk / 1e6:.1f} MB.")


def timeline_rows(run: Path, sets) -> tuple[list[str], list[list]]:
    from andrea.snapshots.timeline import Timeline, pair_series, rho_series

    tl = Timeline(run)
    ps = pair_series(tl, [("cat", "dog"), ("cat", "Tuesday")], "input", centre=True)
    rs = rho_series(tl, sets, "input", centre=True)
    head = ["step", "cos cat·dog", "cos cat·Tuesday"] + [f"ρ {k} (n {v['n']})" for k, v in rs["sets"].items()]
    rows = []
    for i, step in enumerate(tl.steps):
        if 0 < step and step & (step - 1) == 0 and step.bit_length() % 2 == 0 and step != tl.steps[-1]:
            continue  # 2, 8, 32, …: the log-spaced snapshots are shown at 1, 4, 16, 64, … (andrea embed timeline has all)
        rows.append([f"{step:,}", f"{ps['series']['cat·dog'][i]:+.3f}", f"{ps['series']['cat·Tuesday'][i]:+.3f}"]
                    + [f"{v['rho'][i]:+.3f}" for v in rs["sets"].values()])
    return head, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a checkpoint or run folder (default: the newest runs/main-*)")
    ap.add_argument("--data", help="the data folder for the PPMI reference (default: the run's own)")
    args = ap.parse_args(argv)
    try:
        path = Path(args.checkpoint) if args.checkpoint else newest_main_checkpoint()
        run = path if path.is_dir() else path.parent
        subject = load_subject(checkpoint=path)
        data_dir = Path(args.data) if args.data else Path(json.loads((run / "train.json").read_text())["data"])
        sets = load_wordsets()
        model = subject.model
        V, d = model.config.vocab_size, model.config.n_embd
        index = word_index(subject.tokenizer, V, sets)
        tables = model_tables(model)
        t0 = time.perf_counter()
        tables["ppmi"] = ppmi_vectors(train_token_chunks(open_token_data(data_dir)), V, d)
        ppmi_s = time.perf_counter() - t0
        report = similarity(tables, index, sets).to_dict()
    except (AndreaError, OSError, KeyError, ValueError) as e:
        print(f"bench_similarity: error: {e}", file=sys.stderr)
        return 2
    print("# Word similarity: the model's tables beside counting\n")
    print(machine_line() + "\n")
    from andrea.checkpoint import load_checkpoint

    step = load_checkpoint(path).step
    print(f"checkpoint `{path}` (step {step:,}; d {d}, {model.config.n_layer} layers, V {V:,}); data `{data_dir}`; "
          f"PPMI reference computed in {ppmi_s:.1f} s.\n")
    for name, c in report["coverage"].items():
        print(f"- {name}: {c['pairs']} pairs, {c['single_token_pairs']} of them pairs of single tokens; "
              f"{c['single_token_words']} of {c['words']} words ({100 * c['single_token_words'] / c['words']:.0f}%) are "
              f"single tokens in their word-initial form.")
    forms = ", ".join(f"{w} = {' + '.join(p.replace(' ', '␣') for p in report['forms'][w])}" for w in LESSON_WORDS)
    print(f"- the lesson's words: {forms}.")
    print(f"- random rows at initialisation: cos θ 0 ± {report['init_band']:.3f} (1/√d).\n")
    print(md_table(["table", "", "SimLex ρ, single tokens", "SimLex ρ, all", "WordSim ρ, single tokens", "WordSim ρ, all",
                    "analogies, 3CosAdd", "mean cos", "cat·dog", "cat·Tuesday"], score_rows(report),
                   right={6, 7, 8, 9}))
    print()
    for line in verdict(report):
        print(f"- {line}")
    if (run / "embeddings").is_dir():
        print("\n## The input table learning (centred), at the run's snapshots (steps 0, 1, 4, 16, 64, … and evaluations)\n")
        head, rows = timeline_rows(run, sets)
        print(md_table(head, rows, right=set(range(len(head)))))
        print(f"\n{cost(run)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
