"""Candidates for the main job at equal wall time: what each one teaches in the same minutes.

Every candidate is the main job (`andrea main`: the default corpus, the main job's tokenizer,
V 8,961, the UCB1 curriculum) with some of its settings replaced: the model's shape (width,
depth, heads, context), the batch, the sequence length, the peak learning rates, the recipe. Each
trains for the same `--minutes`, one run after another, nothing else on the machine, in the number
format `andrea.processor` chooses (bf16 autocast where the CPU computes it natively, float32
elsewhere; run the script under `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2` for the
emulated kind). The `peer` candidate is the recipe a learner would otherwise copy: nanoGPT's
(AdamW β 0.9/0.95, linear warm-up into cosine decay; andrea's recipe v2) on the same shape.

For each run it records what the lessons check, read from their own code on the best checkpoint:
steps and tokens, validation bits per byte (all held-out text, and by source), `andrea lesson`'s
verdicts and cat·dog / cat·pet against the unrelated pairs (the margin, target 3/√d), WordSim-353
and SimLex-999 on the table beside PPMI on the same tokens, `andrea lesson attention`'s verdicts,
its best previous-token and induction scores on the repeated random probe, every head removed at
once and the later-tokens gain, and bench_chat.py's replies (the share that are readable: 3 words
or more, ending at the turn, no 4 words of the prompt). A finished run's record
(`candidate.json` in its folder) is reused, so the table grows run by run: it shows every
candidate tried under `--out`, whichever call ran it.

    .venv/bin/python benchmarks/bench_candidates.py --candidates now --seeds 1337          # one run, 15 minutes
    .venv/bin/python benchmarks/bench_candidates.py --candidates now t128 peer --seeds 1337 1338 1339
    .venv/bin/python benchmarks/bench_candidates.py --table                                 # every run kept, no training
    .venv/bin/python benchmarks/bench_candidates.py --rechat "at temperature 1.0"            # the chat again, every kept run

`--rechat WHAT` measures the chat of every kept run again with andrea's current `andrea chat` (after a
change to the turn format, as when chat prompts came to end at `<`, or to its sampling), keeping
each earlier figure in `chat_history` under WHAT, the words that say how it was measured; the table
shows them beside the current one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from common import load_average, machine_line, md_table, say

# name -> (what it changes, MainJob fields). Every candidate tried stays here, chosen or not, so
# the table can be remade from the runs it names; each names its width, so that a later change of
# andrea-cpu's own does not change what a kept row ran.
W256 = {"n_embd": 256, "n_head": 8}  # andrea-cpu's width before d128
W128 = {"n_embd": 128, "n_head": 4}


def t128(width: dict) -> dict:
    """t128's context and batch (32 × 128) at a width: n_embd and n_head."""
    return {"model": {"block_size": 128, **width}, "seq_len": 128, "batch_size": 32}


T128 = t128(W256)
CONTEXT_256 = {"model": {"block_size": 256, **W256}, "seq_len": 256, "batch_size": 16}  # the main job's shape before t128
CANDIDATES = {
    "now": ("andrea-cpu as the main job trained it before this choice (d 256, 4 blocks of 8 heads, context 256, "
            "16 × 256, v3 at lr 6e-3)", CONTEXT_256),
    "t128": ("context 128 at 32 × 128: the same tokens a step, attention half as long, positions learned over 128 rows "
             "(chosen: the main job's context since)", T128),
    "lr1e-2": ("v3's peak learning rate 1e-2 for every group (6e-3 now), at context 256", {"lr": 1e-2, **CONTEXT_256}),
    "t128-lr1e-2": ("t128's shape with v3's peak learning rate 1e-2 for every group (6e-3 in t128)", {"lr": 1e-2, **T128}),
    "t128-tables1e-2": ("t128's shape with the AdamW groups (the two tables, the head, the norms) at a peak of 1e-2 and "
                        "Muon's matrices kept at 6e-3: per-group rates", {"lr": 1e-2, "muon_lr": 6e-3, **T128}),
    "t128-fast": ("t128's settings after a bf16 step on a CPU came to compute attention in plain products and the "
                  "loss's float32 block in a kept buffer: the same model and recipe, more steps in the same minutes",
                  T128),
    "d192": ("narrower: d 192 in 4 blocks of 6 heads (head size 32 as before) at t128's context and batch; the head and "
             "the blocks take 0.58× the FLOPs a token, so about 1.7× the tokens in the same minutes",
             t128({"n_embd": 192, "n_head": 6})),
    "d128": ("narrower still: d 128 in 4 blocks of 4 heads (head size 32) at t128's context and batch; 0.36× the FLOPs "
             "a token, about 2.8× the tokens in the same minutes (chosen: andrea-cpu's width since)",
             t128(W128)),
    "peer": ("nanoGPT's recipe on the shape of now: AdamW β 0.9/0.95, warm-up into cosine (andrea's v2, lr 2e-3)",
             {"recipe": "v2", **CONTEXT_256}),
    "peer-d128": ("nanoGPT's recipe (v2, lr 2e-3) on d128's shape: the peer at the width andrea chose, same context, "
                  "batch and minutes", {"recipe": "v2", **t128(W128)}),
}


def run_one(name: str, seed: int, minutes: float, out: Path) -> dict:
    """Train one candidate for one seed (or reuse its record) and score it."""
    from andrea.config import count_params
    from andrea.mainjob import MainJob, run_main_job
    from andrea.processor import compute_dtype

    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "")  # the emulated kind keeps runs of its own
    folder = out / (f"{name}-seed-{seed}" + (f"-{isa.lower()}" if isa else ""))
    done = folder / "candidate.json"
    if done.exists():
        say(f"{name}, seed {seed}: reusing {done}")
        return json.loads(done.read_text())
    job = MainJob.on("cpu", minutes=minutes, seed=seed, out=folder, samples=1, **CANDIDATES[name][1])
    shape = job.shape("cpu")
    cfg = job.model_config(shape)
    load = load_average()
    say(f"{name}, seed {seed}: training for {minutes:g} minutes into {folder}")
    summary = run_main_job(job, log=say)
    checkpoint = summary["best_checkpoint"]
    r = {"candidate": name, "seed": seed, "minutes": minutes, "load": load, "format": str(compute_dtype("cpu")),
         "emulated_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""), "params": count_params(cfg),
         "shape": {"d": cfg.n_embd, "layers": cfg.n_layer, "heads": cfg.n_head, "T": cfg.block_size,
                   "batch": shape["batch_size"], "seq": min(shape["seq_len"], cfg.block_size)},
         "tokens": summary["steps"] * shape["batch_size"] * min(shape["seq_len"], cfg.block_size),
         **{k: summary[k] for k in ("steps", "tokens_per_s", "val_bpb", "val_bpb_se", "val_bpb_by_source", "data")},
         **scores(checkpoint, summary["data"])}
    done.write_text(json.dumps(r, indent=2) + "\n")
    return r


def scores(checkpoint: str, data: str) -> dict:
    """What both lessons and the chat say of the checkpoint."""
    from bench_vocab import ppmi_scores
    from bench_vocab import scores as table_scores

    from andrea.inside.lessons import attention, embedding

    say("scoring: the embedding lesson, word similarity and PPMI")
    table = table_scores(checkpoint)
    ppmi = ppmi_scores(checkpoint, data)
    steps = embedding.lesson(embedding.load_inputs(checkpoint))
    say("scoring: the attention lesson")
    att = attention.lesson(attention.load_inputs(checkpoint))
    by = {s.key: s for s in att}
    kinds = by["heads"].numbers.get("kinds", {})
    return {
        "embedding_verdicts": {s.key: s.verdict for s in steps},
        "attention_verdicts": {s.key: s.verdict for s in att},
        "lesson": table["lesson"], "margin": table["margin"], "band": table["band"],
        "wordsim": table["wordsim"], "simlex": table["simlex"],
        "ppmi_wordsim": ppmi["wordsim"], "ppmi_simlex": ppmi["simlex"],
        "previous": kinds.get("previous", {}).get("best"), "induction": kinds.get("induction", {}).get("best"),
        "first": kinds.get("first", {}).get("best"),
        "all_heads": by["ablation"].numbers.get("all_heads"), "largest_head": by["ablation"].numbers.get("largest"),
        "later": by["later"].numbers.get("score"), "later_se": by["later"].numbers.get("standard_error"),
        **chat_scores(Path(checkpoint)),
    }


def chat_scores(checkpoint: Path) -> dict:
    """bench_chat.py's replies to its prompts under its seeds: the shares and the first examples."""
    from bench_chat import MAX_NEW_TOKENS, PROMPTS, SEEDS, measure

    say(f"scoring: the chat of {checkpoint}")
    chat = measure(Path(checkpoint), PROMPTS, SEEDS, MAX_NEW_TOKENS)
    return {"chat": {k: chat[k] for k in ("non_empty", "turn", "readable", "words")},
            "chat_examples": [{"prompt": r["prompt"], "reply": r["reply"][:200]} for r in chat["replies"][:3]]}


def rechat(path: Path, before: str) -> None:
    """A kept run's chat measured again with andrea chat as it is now; the figures it replaces join
    `chat_history`, labelled `before` (how they were measured), after any earlier ones."""
    r = json.loads(path.read_text())
    r["chat_history"] = chat_history(r) + [{"before": before, **r["chat"]}]
    r.pop("chat_before", None)
    r.update(chat_scores(path.parent / "best.safetensors"))
    path.write_text(json.dumps(r, indent=2) + "\n")


def count(verdicts: dict) -> str:
    """holds / caveat / does not hold, over a walk's steps."""
    values = list(verdicts.values())
    return f"{sum(v == 'holds' for v in values)}/{sum(v.startswith('holds with') for v in values)}/" \
           f"{sum(v.startswith('does not') for v in values)}"


def row(r: dict) -> list:
    lesson = r["lesson"]
    unrelated = max(v["cos"] for k, v in lesson.items() if k not in ("cat·dog", "cat·pet"))
    return [r["candidate"], str(r["seed"]), r["format"].removeprefix("torch.") + (" (AVX2)" if r["emulated_isa"] else ""),
            f"{r['steps']:,}", f"{r['tokens'] / 1e6:.2f} M", f"{r['val_bpb']:.4f} ± {r['val_bpb_se']:.4f}",
            ", ".join(f"{k} {v:.3f}" for k, v in r["val_bpb_by_source"].items()),
            f"{lesson['cat·dog']['cos']:+.3f} / {lesson['cat·pet']['cos']:+.3f} / {unrelated:+.3f}",
            f"{r['margin']:+.3f}", f"{r['wordsim']['rho']:+.2f} ({r['ppmi_wordsim']['rho']:+.2f})",
            f"{r['simlex']['rho']:+.2f} ({r['ppmi_simlex']['rho']:+.2f})",
            f"{r['previous']:.2f} / {r['induction']:.2f}", f"{r['all_heads']:+.3f}",
            f"{r['later']:+.3f} ± {r['later_se']:.3f}", count(r["embedding_verdicts"]), count(r["attention_verdicts"]),
            f"{100 * r['chat']['readable']:.0f}% ({100 * r['chat']['turn']:.0f}%)"
            + "".join(f"; {h['before']} {100 * h['readable']:.0f}% ({100 * h['turn']:.0f}%)"
                      for h in chat_history(r))]


def chat_history(r: dict) -> list[dict]:
    """A record's earlier chat figures, oldest first (a record from before chat_history: its chat_before)."""
    if "chat_before" in r:
        return [{"before": "before the turn-format fix", **r["chat_before"]}] + r.get("chat_history", [])
    return r.get("chat_history", [])


def mean_row(name: str, runs: list[dict]) -> list:
    def ms(values, fmt):
        values = list(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{format(statistics.mean(values), fmt)} ± {format(sd, fmt.lstrip('+'))}"

    return [name, f"mean of {len(runs)}", "", ms((r["steps"] for r in runs), ",.0f"),
            ms((r["tokens"] / 1e6 for r in runs), ".2f") + " M", ms((r["val_bpb"] for r in runs), ".4f"), "", "",
            ms((r["margin"] for r in runs), "+.3f"), ms((r["wordsim"]["rho"] for r in runs), "+.2f"),
            ms((r["simlex"]["rho"] for r in runs), "+.2f"), ms((r["previous"] for r in runs), ".2f"),
            ms((r["all_heads"] for r in runs), "+.3f"), ms((r["later"] for r in runs), "+.3f"), "", "",
            ms((100 * r["chat"]["readable"] for r in runs), ".0f") + "%"]


def kept(out: Path) -> list[dict]:
    """Every finished run's record under `out`, in the order of CANDIDATES, then by seed."""
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*/candidate.json"))]
    order = {name: i for i, name in enumerate(CANDIDATES)}
    return sorted(records, key=lambda r: (order.get(r["candidate"], len(order)), r["emulated_isa"], r["seed"]))


def report(records: list[dict], minutes_this_call: float) -> None:
    from bench_chat import corpus_first_replies

    first = records[0]
    bands = {r["shape"]["d"]: r["band"] for r in records}
    goals = ", ".join(f"{b:.3f} at d {d}" for d, b in sorted(bands.items(), reverse=True))
    print("## Candidates for the main job at equal wall time (`bench_candidates.py`)\n")
    print(machine_line() + "\n")
    print(f"Each row is `andrea main` for {first['minutes']:g} minutes with one candidate's settings "
          f"({minutes_this_call:.0f} min of training and scoring in this call; kept runs count their own time). "
          "Candidates: " + "; ".join(f"**{k}**: {v[0]}" for k, v in CANDIDATES.items()) + ". "
          "Format: the number format the step ran in (bfloat16 autocast where the CPU computes it natively; "
          "(AVX2): oneDNN and ATen limited to AVX2, where bf16 is emulated and the step runs in float32). "
          "Validation: bits per byte of the best checkpoint on all held-out text, ± its standard error. Pairs: "
          "cat·dog / cat·pet / the largest unrelated pair, centred cosines of the input table; margin: the lesser "
          f"related less the largest unrelated (goal 3/√d: {goals}). WordSim / SimLex: Spearman ρ on "
          "the centred table (PPMI on the same tokens in brackets). Prev / ind: the best previous-token and induction "
          "head scores on the repeated random probe (`andrea lesson attention` step 5; present above 0.3). All heads: "
          "bits per byte lost with every head removed at once. Later: early minus late loss in nats per token. "
          "Lessons: holds / with a caveat / does not hold over `andrea lesson`'s and `andrea lesson attention`'s steps. "
          "Chat: readable replies (3 words or more, ending at the turn, no 4 words of the prompt), with those ending "
          f"at the turn in brackets, of bench_chat.py's 66; the corpus's own first replies to an opening of 3 words "
          f"or more are {100 * corpus_first_replies()['readable']:.0f}% readable by the same rule.\n")
    rows = []
    names = list(dict.fromkeys((r["candidate"], r["emulated_isa"]) for r in records))
    for name, isa in names:
        runs = [r for r in records if (r["candidate"], r["emulated_isa"]) == (name, isa)]
        rows += [row(r) for r in runs]
        if len(runs) > 1:
            rows.append(mean_row(name, runs))
    print(md_table(["candidate", "seed", "format", "steps", "tokens", "val bpb", "by source", "cat·dog / pet / unrelated",
                    "margin", "WordSim (PPMI)", "SimLex (PPMI)", "prev / ind", "all heads", "later",
                    "lesson", "attention lesson", "chat readable (turn)"], rows,
                   right={3, 4, 5, 8, 9, 10, 11, 12, 13}))
    print("\nThe first chat reply of each run (seed 1 of bench_chat):\n\n```text")
    for r in records:
        for ex in r["chat_examples"][:1]:
            print(f"{r['candidate']} {r['seed']}: > {ex['prompt']} < {ex['reply'].strip()[:120]}")
    print("```")


def main(argv=None) -> int:
    from andrea.errors import AndreaError

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", nargs="+", choices=list(CANDIDATES), default=[], help="candidates to run")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1337], help="seeds (default 1337, the main job's)")
    ap.add_argument("--minutes", type=float, default=15.0, help="minutes of training each (default 15, as andrea main)")
    ap.add_argument("--out", type=Path, default=Path("runs/candidates"), help="the runs' folder (default runs/candidates); "
                    "a run that finished there is reused, and the table shows every run it holds")
    ap.add_argument("--table", action="store_true", help="print the table of the runs kept under --out, training nothing")
    ap.add_argument("--rechat", metavar="WHAT", help="measure the chat of every kept run again with andrea's current "
                    "chat (after a change to its turn format or its sampling), keeping the earlier figures under WHAT "
                    "(how they were measured, e.g. \"at temperature 1.0\"), then print the table")
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        if args.rechat:
            for path in sorted(args.out.glob("*/candidate.json")):
                rechat(path, args.rechat)
        elif not args.table:
            for name in args.candidates:
                for seed in args.seeds:
                    run_one(name, seed, args.minutes, args.out)
    except AndreaError as e:
        print(f"bench_candidates: {e}", file=sys.stderr)
        return 2
    records = kept(args.out)
    if not records:
        print(f"bench_candidates: no finished run under {args.out}; name --candidates to run some.", file=sys.stderr)
        return 2
    report(records, (time.time() - t0) / 60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
