"""`andrea main`: the main job, from nothing to a trained model and its samples (`andrea.mainjob`; this
module is not named `main` so that it never shadows `andrea.cli.main`, the entry point)."""

from __future__ import annotations

from andrea.cli.common import MAX_SEGMENTS
from andrea.decoding import CHAT_TEMPERATURE, CHAT_TOP_K
from andrea.validate import MAX_SEED, flag_number


def cmd_main(args) -> int:
    from andrea.mainjob import MainJob, run_main_job

    job = MainJob(preset=args.preset, minutes=args.minutes, steps=args.steps, out=args.out, sampling=args.sampling, seed=args.seed,
                  recipe=args.recipe, segments=args.segments, compile=args.compile)
    summary = run_main_job(job)
    print()
    se = f" ± {summary['val_bpb_se']:.4f}" if summary["val_bpb_se"] is not None else ""
    print(f"validation bits per byte: {summary['val_bpb']:.4f}{se}  ("
          + ", ".join(f"{n} {v:.3f}" for n, v in summary["val_bpb_by_source"].items()) + ")")
    print(f"  (step {summary['best_step']:,}, on {summary['val_tokens']:,} held-out tokens, evaluated in "
          f"{summary['final_eval_seconds']:.0f} s after training; ± is the standard error)")
    mfu = f", MFU {100 * summary['mfu']:.1f}%" if summary["mfu"] is not None else ""
    print(f"trained {summary['steps']:,} steps in {summary['train_seconds'] / 60:.1f} min at "
          f"{summary['tokens_per_s']:,.0f} tokens/s{mfu}")
    print(f"samples from {summary['best_checkpoint']} (step {summary['best_step']:,}, the lowest validation loss: "
          f"{summary['best_val_bpb']:.4f} bits per byte); repeated 4-grams: the share of the text's word 4-grams "
          f"already seen earlier in it")
    for s in summary["samples"]:
        for kind in ("greedy", "sampled"):
            label = "greedy" if kind == "greedy" else f"sampled (temperature {CHAT_TEMPERATURE:g}, top-k {CHAT_TOP_K})"
            text = (s["prompt"] + s[kind]).replace("\n", "\n    ")
            print(f"  {label}, repeated 4-grams {100 * s[kind + '_repeated_4grams']:.0f}%:\n    {text}")
    print(f"  a chat in andrea chat's turn format (temperature {CHAT_TEMPERATURE:g}, top-k {CHAT_TOP_K}):")
    for turn in summary["chat"]:
        cut = " [the length limit]" if turn["ended"] == "limit" else ""
        print(f"    > {turn['line']}\n    < {turn['reply']}{cut}")
    print(f"checkpoint: {summary['checkpoint']}")
    print(f"try: andrea generate --checkpoint {summary['best_checkpoint']} --prompt 'The'")
    return 0


def register(sub) -> None:
    from andrea.mainjob_settings import MAIN_RECIPE, MAIN_SEGMENTS, RECIPE_SETTINGS
    from andrea.trainconfig import SAMPLING

    p = sub.add_parser("main", help="the main job: fetch the corpus, fit the tokenizer, train a CPU model, sample",
                       description="Fetch the default corpus (cached), fit the Harris tokenizer on the training text "
                                   "with an equal share per source (cached), tokenize it into shards (cached), train a "
                                   "CPU-sized model with the UCB1 curriculum for a bounded time, then print validation "
                                   "bits per byte, a few samples and where the checkpoint is.")
    p.add_argument("--preset", help="model preset, with its own vocabulary (default: andrea-cpu at 32 x 128 on a CPU; "
                   f"on a CUDA GPU andrea-12m's body with the main job's {MAIN_SEGMENTS:,} segments, V {MAIN_SEGMENTS + 257:,}, at 32 x 1024, "
                   "stopped when validation stops improving)")
    p.add_argument("--minutes", type=flag_number(float, 0, 10_000, lo_open=True), default=15.0, help="minutes of training (default 15)")
    p.add_argument("--steps", type=flag_number(int, 1, 1_000_000_000), help="train for this many steps instead of --minutes (a model that does not "
                   "depend on the machine's speed or load; the v3 schedule then decays over steps)")
    p.add_argument("--segments", type=flag_number(int, 1, MAX_SEGMENTS), metavar="N", help="the tokenizer's segments, and so the model's vocabulary "
                   f"(V = N + 257; default: the preset's, and {MAIN_SEGMENTS:,} on a CUDA GPU without --preset)")
    p.add_argument("--out", help="the run folder (default runs/main-<date>-<time>)")
    p.add_argument("--sampling", default="ucb", choices=SAMPLING,
                   help="how each step's source is chosen (default: the UCB1 curriculum)")
    p.add_argument("--seed", type=flag_number(int, 0, MAX_SEED), default=1337, help="seed of everything random (default 1337)")
    p.add_argument("--recipe", default=MAIN_RECIPE, choices=list(RECIPE_SETTINGS),
                   help=f"the training recipe, with the settings measured for it (default {MAIN_RECIPE})")
    p.add_argument("--compile", action="store_true", help="torch.compile the model; compiling counts against "
                   "--minutes (BENCHMARKS.md, \"Compiling the main job at equal wall time\", says whether it pays)")
    p.set_defaults(func=cmd_main)
