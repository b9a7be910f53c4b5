"""The main job's training step on a trained model, with subnormal floats and with them flushed to zero.

Why subnormal floats slow a trained model's step, and why the training commands flush them to
zero before torch starts its threads, is `andrea.processor`'s to say. This script times the main
job's step (its shape, recipe and optimizer as `andrea main` sets them up, on batches of the run's
own training tokens drawn as training draws them) on the model at step 0 and on the trained
checkpoint, with subnormals kept (as training ran before) and flushed (as it runs now), each
setting in a process of its own (the mode is fixed when torch's threads start); the settings take
turns over --rounds, each round from the same weights and a new optimizer, and the first batch's
loss shows that both compute the same step.

    .venv/bin/python benchmarks/bench_denormal.py                             # the newest runs/main-*
    .venv/bin/python benchmarks/bench_denormal.py --checkpoint runs/lr-2e-2/segments-8192-seed-1337 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import machine_line, md_table, say  # noqa: E402


def batches(data, n: int, batch: int, seq: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n (inputs, targets) batches as training draws them (andrea.shards.TokenData), each of one
    source chosen at random (seeded)."""
    rng = np.random.default_rng(seed)
    names = data.names
    out = []
    for _ in range(n):
        source = names[int(rng.integers(len(names)))]
        out.append(data.windows(source, data.sample_offsets(source, batch, seq, rng), seq))
    return out


def time_steps(state: dict, cfg, data: list[tuple[torch.Tensor, torch.Tensor]], warmup: int) -> tuple[list[float], float]:
    """Seconds of each step after `warmup`, and the first batch's loss, from `state` with a new optimizer."""
    from andrea.mainjob import MainJob
    from andrea.model import ANDREA, tune_for_training

    model = ANDREA(cfg)
    model.load_state_dict(state)
    model.train()
    tune_for_training(model, torch.device("cpu"))
    opt = MainJob().optimizer(model)
    times, first = [], None
    for i, (x, y) in enumerate(data):
        start = time.perf_counter()
        loss = model(x, targets=y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
        first = loss.item() if first is None else first
    return times, first


def child(run: Path, flush: bool, steps: int, warmup: int) -> dict:
    """One setting's round: {model: {"times": [...], "loss": first loss}} for step 0 and the checkpoint."""
    if flush:
        from andrea.processor import flush_subnormals

        flush_subnormals()  # first, as the training commands do
    from andrea.checkpoint import load_model
    from andrea.errors import AndreaError
    from andrea.mainjob_settings import SHAPES
    from andrea.model import ANDREA
    from andrea.usage import run_data

    model, _, ckpt = load_model(run)
    data, why = run_data(run, model.config.vocab_size)
    if data is None:
        raise AndreaError(f"the run's training tokens are needed: {why}.")
    cfg, shape = model.config, SHAPES["cpu"]
    seq = min(shape["seq_len"], cfg.block_size)
    data_batches = batches(data, warmup + steps, shape["batch_size"], seq)
    torch.manual_seed(0)
    models = {"step 0 (a fresh model)": ANDREA(cfg).state_dict(), f"step {ckpt.step:,} (trained)": model.state_dict()}
    out = {"shape": f"{shape['batch_size']} × {seq}", "config": [cfg.n_embd, cfg.n_layer, cfg.vocab_size], "models": {}}
    for name, state in models.items():
        times, loss = time_steps(state, cfg, data_batches, warmup)
        out["models"][name] = {"times": times, "loss": loss}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", nargs="+", help="run folders of the main job, measured one after the other "
                    "(default: the newest runs/main-*)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the two settings take turns (default 3)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per model per round, after 2 warm-up (default 8)")
    ap.add_argument("--child", choices=["kept", "flushed"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        ap.error("--rounds and --steps must be at least 1.")
    from bench_chat import newest_main_run

    from andrea.errors import AndreaError

    warmup = 2
    try:
        runs = [Path(c) for c in args.checkpoint] if args.checkpoint else [newest_main_run()]
        if args.child:
            print(json.dumps(child(runs[0], args.child == "flushed", args.steps, warmup)))
            return 0
    except AndreaError as e:
        print(f"bench_denormal: {e}", file=sys.stderr)
        return 2
    rows, t0 = [], time.time()
    for run in runs:
        results: dict = {"kept": [], "flushed": []}
        for r in range(args.rounds):
            for setting in (("kept", "flushed") if r % 2 == 0 else ("flushed", "kept")):
                say(f"{run}: subnormals {setting}, round {r + 1} of {args.rounds}")
                done = subprocess.run([sys.executable, __file__, "--checkpoint", str(run), "--steps", str(args.steps),
                                       "--child", setting], capture_output=True, text=True)
                if done.returncode != 0:
                    print(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"bench_denormal: the "
                          f"{setting} round failed.", file=sys.stderr)
                    return 2
                results[setting].append(json.loads(done.stdout.strip().splitlines()[-1]))
        first = results["kept"][0]
        for name in first["models"]:
            ms = {k: 1e3 * statistics.median(t for r in v for t in r["models"][name]["times"]) for k, v in results.items()}
            loss = {k: v[0]["models"][name]["loss"] for k, v in results.items()}
            rows.append([f"`{run}`", name, f"{ms['kept']:,.0f}", f"{ms['flushed']:,.0f}", f"{ms['kept'] / ms['flushed']:.2f}×",
                         f"{loss['kept']:.4f} / {loss['flushed']:.4f}"])
    d, layers, V = first["config"]
    print("## The training step on a trained model, subnormal floats kept and flushed\n")
    print(machine_line() + "\n")
    print(f"d {d}, {layers} layers, V {V:,}; the main job's step at {first['shape']}, recipe and optimizer as "
          f"`andrea main` sets them up, on the run's training tokens; {args.rounds} rounds × {args.steps} steps a model "
          f"and setting after {warmup} warm-up steps, each setting in a process of its own, taking turns; ms: the median "
          f"step ({time.time() - t0:.0f} s in all). Loss: the first batch's, kept / flushed.\n")
    print(md_table(["run", "model", "ms a step, subnormals kept", "ms a step, flushed", "kept / flushed", "loss"], rows,
                   right={2, 3, 4}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
