"""The main job's vocabulary at equal wall time: segment counts (and seeds) side by side on the default corpus.

For every segment count (`--segments`) and seed (`--seeds`), the main job is run as `andrea main
--segments N --seed S` runs it (the default corpus, its tokenizer fitted with an equal share per
source, andrea-cpu's body (its width, depth and heads) with V = N + 257, recipe v3) for the same `--minutes` of
training, one after the other, so each run gets the same wall time on the same machine. Printed per count: the
model's parameters, the steps and tokens per second it reached, validation bits per byte (all
sources and each; bits per byte do not depend on the vocabulary), the share of SimLex-999's and
WordSim-353's words that are single tokens in their word-initial form, the lesson's words that
are, and the word-similarity scores of the centred input table (all pairs; n and null spread in
the JSON, and over the pairs of words that stand alone in the run's training text) with the
lesson's cos(␣cat, ␣dog) − cos(␣cat, ␣Tuesday) and its margin (andrea.inside.wordsim.lesson_margin)
against 3/√d, `andrea lesson`'s verdicts on its pairs and scores steps, and bench_chat.py's chat
measure of the best checkpoint; beside them the
same scores of the count-based reference on the same training tokens (PPMI of ±2-token
co-occurrences, SVD to d, centred; `andrea.inside.wordsim.ppmi_vectors`), once per segment count. With
several seeds, a row of means ± standard deviations follows each count's runs.

    .venv/bin/python benchmarks/bench_vocab.py                               # 4096 6144 8192, 6 min each
    .venv/bin/python benchmarks/bench_vocab.py --segments 6144 8192 --minutes 3 --out runs/vocab
    .venv/bin/python benchmarks/bench_vocab.py --segments 8704 --seeds 1337 1338 1339 --minutes 15   # the main job, 3 seeds
    .venv/bin/python benchmarks/bench_vocab.py --segments 8192 --minutes 15 --lr 2e-2 --muon-lr 6e-3 --out runs/lr   # other rates

`--lr` and `--muon-lr` replace the recipe's peak learning rates (v3: the AdamW groups' and the
Muon-trained matrices'), as `andrea.mainjob.MainJob` takes them; the header says which ran.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from common import load_average, machine_line, md_table, say


def table_scores(table: dict) -> dict:
    """ρ on both sets (all pairs, and pairs of words that stand alone where the usage is known) and
    the lesson's gap, of one centred table's report."""
    from andrea.inside.wordsim import lesson_margin

    cos = {k: v["cos"] for k, v in table["lesson"].items()}
    gap = cos["cat·dog"] - cos["cat·Tuesday"]
    margin = lesson_margin(cos, {k: v["single"] for k, v in table["lesson"].items()})
    return {"simlex": table["simlex999"]["all"], "wordsim": table["wordsim353"]["all"], "gap": gap, "margin": margin,
            "simlex_alone": table["simlex999"].get("standalone"), "wordsim_alone": table["wordsim353"].get("standalone"),
            "lesson": table["lesson"]}


def standalone_index(index, checkpoint: str, tok) -> None:
    """Mark the words whose tokens stand alone in the run's training text (andrea.usage)."""
    from andrea.usage import run_usage

    usage, _ = run_usage(checkpoint, tok)
    if usage is not None:
        index.standalone = usage.standalone_words()


def chat_scores(checkpoint: str) -> dict:
    """bench_chat's measure of the checkpoint: shares of non-empty replies and of replies ending at the turn."""
    from bench_chat import MAX_NEW_TOKENS, PROMPTS, SEEDS, measure

    r = measure(Path(checkpoint), PROMPTS, SEEDS, MAX_NEW_TOKENS)
    return {"non_empty": r["non_empty"], "turn": r["turn"], "replies": len(r["replies"])}


def lesson_verdicts(checkpoint: str) -> dict:
    """`andrea lesson`'s verdicts on the pairs and the scores steps (5 and 6) of the checkpoint."""
    from andrea.inside.lessons.embedding import load_inputs, step_pairs, step_scores

    inp = load_inputs(checkpoint)
    return {step.__name__.removeprefix("step_"): step(inp).verdict for step in (step_pairs, step_scores)}


def scores(checkpoint: str) -> dict:
    """Coverage and the centred input table's scores of a trained checkpoint."""
    from andrea.checkpoint import load_model
    from andrea.inside.wordsim import LESSON_WORDS, load_wordsets, model_tables, similarity, word_index

    model, tok, _ = load_model(checkpoint)
    sets = load_wordsets()
    index = word_index(tok, model.config.vocab_size, sets)
    standalone_index(index, checkpoint, tok)
    report = similarity(model_tables(model), index, sets, analogies=False)
    return {"chat": chat_scores(checkpoint), "verdicts": lesson_verdicts(checkpoint), "coverage": report.coverage, "lesson_single": [w for w in LESSON_WORDS if index.single(w)],
            "band": 3 / math.sqrt(report.d), **table_scores(report.tables["input"]["centred"])}


def ppmi_scores(checkpoint: str, data: str) -> dict:
    """The PPMI reference's centred scores on the run's training tokens."""
    from andrea.checkpoint import load_model
    from andrea.inside.wordsim import load_wordsets, ppmi_vectors, similarity, train_token_chunks, word_index
    from andrea.shards import open_token_data

    model, tok, _ = load_model(checkpoint)
    sets = load_wordsets()
    v, d = model.config.vocab_size, model.config.n_embd
    vectors = ppmi_vectors(train_token_chunks(open_token_data(data)), v, d)
    index = word_index(tok, v, sets)
    standalone_index(index, checkpoint, tok)
    report = similarity({"ppmi": vectors}, index, sets, analogies=False)
    return table_scores(report.tables["ppmi"]["centred"])


# A record written before records named their body was made on andrea-cpu's body of then.
BODY_BEFORE = "d 256, 4 layers, 8 heads"


def body_of(cfg) -> str:
    return f"d {cfg.n_embd}, {cfg.n_layer} layers, {cfg.n_head} heads"


def run_one(n: int, seed: int, args, out: Path) -> dict:
    from andrea.config import N_SPECIAL, count_params, get_preset
    from andrea.mainjob import MainJob, run_main_job

    folder = out / f"segments-{n}-seed-{seed}"
    done = folder / "bench_vocab.json"
    if done.exists():
        say(f"{n:,} segments, seed {seed}: reusing {done}")
        return json.loads(done.read_text())
    job = MainJob.on("cpu", minutes=args.minutes, seed=seed, segments=n, out=folder, samples=args.samples,
                     compile=args.compile, lr=args.lr, muon_lr=args.muon_lr)
    load = load_average()
    summary = run_main_job(job, log=say)
    body = get_preset(job.preset)
    params = count_params(body.replace(vocab_size=n + N_SPECIAL))
    r = {"segments": n, "seed": seed, "params": params, "load": load, "body": body_of(body), **{k: summary[k] for k in (
        "steps", "tokens_per_s", "val_bpb", "val_bpb_se", "val_bpb_by_source", "best_val_bpb", "train_seconds", "best_checkpoint",
        "data")}, **scores(summary["best_checkpoint"])}
    done.write_text(json.dumps(r, indent=2) + "\n")
    return r


def row(r: dict) -> list:
    share = {k: f"{c['single_token_words'] / c['words']:.0%}" for k, c in r["coverage"].items()}
    by = ", ".join(f"{k} {v:.3f}" for k, v in r["val_bpb_by_source"].items())
    se = f" ± {r['val_bpb_se']:.4f}" if r.get("val_bpb_se") is not None else ""
    chat = r.get("chat")
    chat = f"{chat['non_empty']:.0%} / {chat['turn']:.0%}" if chat else ""
    return [f"{r['segments']:,}", f"{r['segments'] + 257:,}", str(r["seed"]), f"{r['params']:,}", f"{r['steps']:,}",
            f"{r['tokens_per_s']:,.0f}", f"{r['val_bpb']:.4f}{se}", by, share["simlex999"], share["wordsim353"],
            " ".join(r["lesson_single"]) or "-", f"{r['simlex']['rho']:+.3f}", f"{r['wordsim']['rho']:+.3f}",
            alone(r), lesson_cos(r), f"{r['gap']:+.3f} / {r['margin']:+.3f}", verdicts(r), chat, r["load"]]


def lesson_cos(r: dict) -> str:
    """cat·dog / cat·pet / cat·Tuesday / cat·xylophone, cos on the centred input table."""
    return " / ".join(f"{r['lesson'][p]['cos']:+.3f}" for p in ("cat·dog", "cat·pet", "cat·Tuesday", "cat·xylophone"))


def verdicts(r: dict) -> str:
    v = r.get("verdicts")
    return f"{v['pairs']} / {v['scores']}" if v else ""


def alone(r: dict) -> str:
    """SimLex ρ / WordSim ρ over pairs of words that stand alone, with n."""
    if not r.get("simlex_alone") or not r.get("wordsim_alone"):
        return ""
    s, w = r["simlex_alone"], r["wordsim_alone"]
    return f"{s['rho']:+.3f} (n {s['n']}) / {w['rho']:+.3f} (n {w['n']})"


def mean_row(runs: list[dict]) -> list:
    """Means ± standard deviations over one count's seeds."""
    def ms(values, fmt):
        values = list(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{format(statistics.mean(values), fmt)} ± {format(sd, fmt.lstrip('+'))}"

    sources = runs[0]["val_bpb_by_source"]
    by = ", ".join(f"{k} {ms((r['val_bpb_by_source'][k] for r in runs), '.3f')}" for k in sources)
    return [f"{runs[0]['segments']:,}", "", f"mean of {len(runs)}", "", ms((r["steps"] for r in runs), ",.0f"),
            ms((r["tokens_per_s"] for r in runs), ",.0f"), ms((r["val_bpb"] for r in runs), ".4f"), by, "", "", "",
            ms((r["simlex"]["rho"] for r in runs), "+.3f"), ms((r["wordsim"]["rho"] for r in runs), "+.3f"),
            (f"{ms((r['simlex_alone']['rho'] for r in runs), '+.3f')} / {ms((r['wordsim_alone']['rho'] for r in runs), '+.3f')}"
             if all(r.get("simlex_alone") and r.get("wordsim_alone") for r in runs) else ""),
            " / ".join(ms((r["lesson"][p]["cos"] for r in runs), "+.3f") for p in ("cat·dog", "cat·pet", "cat·Tuesday",
                                                                                   "cat·xylophone")),
            f"{ms((r['gap'] for r in runs), '+.3f')} / {ms((r['margin'] for r in runs), '+.3f')}", "",
            (f"{ms((r['chat']['non_empty'] * 100 for r in runs), '.0f')}% / {ms((r['chat']['turn'] * 100 for r in runs), '.0f')}%"
             if all(r.get("chat") for r in runs) else ""), ""]


def rate_note(args) -> str:
    """Where the runs' learning rates differ from the recipe's, which ones they were."""
    from andrea.mainjob import MainJob

    if args.lr is None and args.muon_lr is None:
        return ""
    settings = MainJob(lr=args.lr, muon_lr=args.muon_lr).train_settings()
    return f", at peak learning rates lr {settings['lr']:g}, muon_lr {settings.get('muon_lr') or settings['lr']:g} (not the recipe's)"


def main(argv=None) -> int:
    from bench_chat import PROMPTS, SEEDS

    from andrea.errors import AndreaError
    from andrea.usage import STANDALONE_RULE

    CHAT_REPLIES = len(PROMPTS) * len(SEEDS)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segments", nargs="+", type=int, default=[4096, 6144, 8192], help="segment counts (default 4096 6144 8192)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1337], help="seeds (default 1337, the main job's)")
    ap.add_argument("--minutes", type=float, default=6.0, help="minutes of training each (default 6)")
    ap.add_argument("--samples", type=int, default=1, help="samples each run prints in its summary (default 1)")
    ap.add_argument("--compile", action="store_true", help="andrea main --compile: torch.compile the model, its "
                    "compile time counted against the minutes")
    ap.add_argument("--lr", type=float, help="peak learning rate in place of the recipe's (v3: its AdamW groups')")
    ap.add_argument("--muon-lr", type=float, help="v3: the Muon-trained matrices' peak learning rate in place of the "
                    "recipe's")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-vocab"), help="the runs' folder (default runs/bench-vocab); "
                    "a run that finished there is reused")
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        results = {n: [run_one(n, seed, args, args.out) for seed in args.seeds] for n in args.segments}
        say("the PPMI reference on each count's training tokens")
        ppmi = {n: ppmi_scores(runs[0]["best_checkpoint"], runs[0]["data"]) for n, runs in results.items()}
    except AndreaError as e:
        print(f"bench_vocab: {e}", file=sys.stderr)
        return 2
    rows = []
    for n, runs in results.items():
        rows += [row(r) for r in runs]
        if len(runs) > 1:
            rows.append(mean_row(runs))
        p = ppmi[n]
        rows.append([f"{n:,}", "", "PPMI", "", "", "", "", "", "", "", "", f"{p['simlex']['rho']:+.3f}",
                     f"{p['wordsim']['rho']:+.3f}", alone(p), lesson_cos(p), f"{p['gap']:+.3f} / {p['margin']:+.3f}", "", "", ""])
    first = next(iter(results.values()))[0]
    bodies = sorted({r.get("body", BODY_BEFORE) for runs in results.values() for r in runs})
    bands = " / ".join(f"{b:.3f}" for b in sorted({r["band"] for runs in results.values() for r in runs}))
    print("## The main job's vocabulary at equal wall time (`bench_vocab.py`)\n")
    print(machine_line() + "\n")
    print(f"`andrea main --segments N --minutes {args.minutes:g} --seed S{' --compile' if args.compile else ''}` "
          f"for each N and S, one after the other{rate_note(args)} "
          f"({(time.time() - t0) / 60:.0f} min in all, this call; runs reused from earlier calls count their own time); "
          f"andrea-cpu's body ({' / '.join(bodies)}), V = N + 257. Validation: bits per byte on every source's "
          f"held-out text, the final evaluation of the best checkpoint (every source's held-out text whole, each "
          f"source weighed alike; ± its standard error) where the run recorded one, else the last evaluation during training. Single: the share of the set's words that are one token in their "
          f"word-initial form. ρ: Spearman, all pairs (SimLex-999 n {first['simlex']['n']}, null ±"
          f"{first['simlex']['null']:.3f}; WordSim-353 n {first['wordsim']['n']}, null ±{first['wordsim']['null']:.3f}), "
          f"centred input table of the best checkpoint. Lesson gap: cos(␣cat, ␣dog) − cos(␣cat, ␣Tuesday), the "
          f"same table, whose cat·dog / cat·pet / cat·Tuesday / cat·xylophone cos θ are given (xylophone, where it "
          f"is several tokens, as their mean row); margin: the lesser of cat·dog and cat·pet less the greater of the "
          f"unrelated pairs of single tokens (andrea.inside.wordsim.lesson_margin); the target of both is 3/√d = "
          f"{bands}. Lesson: `andrea lesson`'s verdicts on its steps 5 (pairs) and 6 (scores). Standing alone: ρ over the pairs whose two words are "
          f"single tokens {STANDALONE_RULE} of the run's training text (andrea.usage). Chat: bench_chat.py's share of "
          f"non-empty replies / of replies that end at the turn's end ({CHAT_REPLIES} replies a run). PPMI rows: the "
          f"count-based reference on the same training tokens, centred, at the body's d.\n")
    print(md_table(["segments", "V", "seed", "parameters", "steps", "tokens/s", "val bpb", "by source", "SimLex single",
                    "WordSim single", "lesson words single", "SimLex ρ", "WordSim ρ", "SimLex ρ / WordSim ρ, standing alone",
                    "cat·dog / pet / Tuesday / xylophone", "lesson gap / margin", "lesson pairs / scores", "chat",
                    "load at start"],
                   rows, right={0, 1, 3, 4, 5, 6, 11, 12, 15}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
