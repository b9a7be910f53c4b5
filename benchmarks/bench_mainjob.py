"""The main job (`andrea main`) measured: validation bits per byte, steps, speed, MFU, wall time.

Runs `run_main_job(MainJob(minutes=M, out=...))` as `andrea main` does (the corpus, tokenizer and
shards come from the cache after the first run), or, with --summary, reads the summary.json of a
run already made. Then it runs benchmarks/bench_train.py at the run's shape (preset, batch,
sequence length) to put the training loop's tokens/s beside one training step of ANDREA and of
transformers' GPT-2 of the same shape, measured there side by side, and the run's samples for its
first prompt (greedy and sampled; the summary holds the others).

    .venv/bin/python benchmarks/bench_mainjob.py                          # 15 minutes, like andrea main
    .venv/bin/python benchmarks/bench_mainjob.py --minutes 2 --out runs/main-short
    .venv/bin/python benchmarks/bench_mainjob.py --summary runs/main-XXX/summary.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, machine_line, md_table, md_tables, say, shift_headings


def preset_of(model: dict) -> str | None:
    from andrea.config import PRESETS

    return next((name for name, cfg in PRESETS.items() if cfg.to_dict() == model), None)


def run_peer(preset: str, batch: int, seq: int, rounds: int | None, steps: int | None) -> tuple[list[str], str, int]:
    """(command, stdout or the error's last lines, exit status) of bench_train.py at this shape."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_train.py"), "--preset", preset, "--batch", str(batch),
           "--seq", str(seq)]
    if rounds is not None:
        cmd += ["--rounds", str(rounds)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    say("measuring the same shape with " + " ".join(cmd[1:]))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        return cmd, "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:]), proc.returncode
    return cmd, proc.stdout, 0


def peer_tokens_per_s(text: str) -> dict[str, tuple[str, float]]:
    """{'andrea': (cell, value), 'gpt2': (cell, value)} from bench_train's results table."""
    found = {}
    for header, rows in md_tables(text):
        if "tokens/s" not in header:
            continue
        col = header.index("tokens/s")
        for row in rows:
            for key in ("andrea", "gpt2"):
                if row[0].startswith(key) and col < len(row):
                    try:
                        found[key] = (row[col], float(row[col].replace(",", "")))
                    except ValueError:
                        pass
    return found


def main(argv=None) -> int:
    from andrea.config import PRESETS
    from andrea.errors import AndreaError
    from andrea.mainjob import MainJob, run_main_job

    job = MainJob.on("cpu")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=job.minutes, help=f"minutes of training (default {job.minutes:g}, as andrea main)")
    ap.add_argument("--preset", default=job.preset, choices=list(PRESETS), help=f"model (default {job.preset})")
    ap.add_argument("--out", type=Path, help="the run folder (default runs/main-<date>-<time>, as andrea main)")
    ap.add_argument("--seed", type=int, default=job.seed, help=f"seed (default {job.seed})")
    ap.add_argument("--summary", type=Path, help="report this run's summary.json instead of training")
    ap.add_argument("--no-peer", action="store_true", help="skip the bench_train.py comparison")
    ap.add_argument("--peer-rounds", type=int, help="bench_train.py --rounds (default: its own)")
    ap.add_argument("--peer-steps", type=int, help="bench_train.py --steps (default: its own)")
    args = ap.parse_args(argv)

    wall = None
    try:
        if args.summary:
            if not args.summary.is_file():
                raise AndreaError(f"{args.summary} does not exist; give the summary.json of a finished andrea main run.")
            summary = json.loads(args.summary.read_text())
            run_dir = args.summary.parent
        else:
            cfg = PRESETS[args.preset]
            job = MainJob.on("cpu", preset=args.preset, minutes=args.minutes, out=args.out, seed=args.seed,
                             seq_len=min(job.seq_len, cfg.block_size))
            t0 = time.time()
            summary = run_main_job(job, log=say)
            wall = time.time() - t0
            run_dir = Path(summary["checkpoint"]).parent
        settings = json.loads((run_dir / "train.json").read_text())
    except (AndreaError, OSError, json.JSONDecodeError, KeyError) as e:
        print(f"bench_mainjob: error: {e}", file=sys.stderr)
        return 2

    train, model = settings["train"], settings["model"]
    preset = preset_of(model)
    batch, seq = train["batch_size"], train["seq_len"]
    tokens_per_step = batch * seq
    mean_tps = summary["steps"] * tokens_per_step / summary["train_seconds"]
    minutes = train.get("time_limit", 0) / 60 if train.get("time_limit") else None

    print(f"## Main job: {preset or 'custom model'}, {f'{minutes:g} minutes, ' if minutes else ''}"
          f"{train['sampling']} sampling\n")
    print(f"machine: {machine_line()}\n")
    if args.summary:
        finished = datetime.datetime.fromtimestamp(args.summary.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
        source = f"summary `{args.summary}` (written {finished}; measured then, reported now)"
    else:
        source = "this run"
    print(f"{source}: run folder `{run_dir}`, checkpoint `{summary['checkpoint']}`; model d {model['n_embd']}, "
          f"{model['n_layer']} layers, {model['n_head']} heads, V {model['vocab_size']:,}; recipe {train['recipe']}, "
          f"batch {batch} × {seq}, lr {train['lr']:g}, seed {train['seed']}.\n")
    rows = [["validation bits per byte, all sources", f"{summary['val_bpb']:.4f}"]]
    rows += [[f"validation bits per byte, {n}", f"{v:.4f}"] for n, v in summary["val_bpb_by_source"].items()]
    rows += [
        ["steps", f"{summary['steps']:,}"],
        ["training time", f"{summary['train_seconds'] / 60:.2f} min"],
        ["tokens/s, the trainer's last window", f"{summary['tokens_per_s']:,.0f}"],
        [f"tokens/s, mean (steps × {tokens_per_step:,} ÷ training time, evaluations and checkpoints included)",
         f"{mean_tps:,.0f}"],
        ["MFU, the trainer's last window (peak: this CPU's measured fp32 matmul rate)",
         f"{100 * summary['mfu']:.1f}%" if summary.get("mfu") is not None else "not measured"],
        ["total wall time of the main job (corpus, tokenizer, shards, training, samples)",
         f"{summary['total_seconds'] / 60:.2f} min"],
    ]
    if wall is not None:
        rows.append(["wall time of this script's run_main_job call", f"{wall / 60:.2f} min"])
    print(md_table(["measure", "value"], rows))

    if not args.no_peer:
        print("\n### Against transformers' GPT-2 at the same shape\n")
        if preset is None:
            print("bench_train.py takes a preset, and this run's model matches none; no comparison.")
        else:
            cmd, text, rc = run_peer(preset, batch, seq, args.peer_rounds, args.peer_steps)
            shown = " ".join(["benchmarks/bench_train.py", *cmd[2:]])
            if rc != 0:
                print(f"`{shown}` failed (exit {rc}):\n\n```text\n{text}\n```")
            else:
                print(f"`{shown}` printed:\n")
                print(shift_headings(text.strip(), 4))
                found = peer_tokens_per_s(text)
                if "gpt2" in found:
                    gpt2 = found["gpt2"][1]
                    print(f"\nMain job's training loop ÷ one GPT-2 step above, in tokens/s: "
                          f"{summary['tokens_per_s'] / gpt2:.2f}× (last window, {summary['tokens_per_s']:,.0f} ÷ "
                          f"{found['gpt2'][0]}), {mean_tps / gpt2:.2f}× (mean, {mean_tps:,.0f} ÷ {found['gpt2'][0]}). "
                          f"The loop also samples batches, clips gradients and logs, and the two were measured at "
                          f"different moments.")
                else:
                    print("\n(no GPT-2 tokens/s row found in that output to compare with)")

    if summary.get("samples"):
        where = (f" from `{summary['best_checkpoint']}` (step {summary['best_step']:,}, the lowest validation loss, "
                 f"{summary['best_val_bpb']:.4f} bits per byte)") if "best_checkpoint" in summary else ""
        shown = summary["samples"][:1]
        print(f"\n### Samples the main job wrote{where}\n")
        print(f"The first of its {len(summary['samples'])} prompts (the run's summary.json holds every one); repeated "
              f"4-grams: the share of the text's word 4-grams already seen earlier in it.\n\n```text")
        for s in shown:
            if isinstance(s, str):  # a summary written before samples came in pairs
                print(s.strip() + "\n")
                continue
            for kind, label in (("greedy", "greedy"), ("sampled", "sampled, temperature 0.8, top-k 40")):
                print(f"[{label}; repeated 4-grams {100 * s[kind + '_repeated_4grams']:.0f}%]")
                print((s["prompt"] + s[kind]).strip() + "\n")
        print("```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
