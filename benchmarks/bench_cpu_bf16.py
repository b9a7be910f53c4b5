"""The main job's training step where bfloat16 is native and where it is emulated, on one machine.

A CPU without AVX512_BF16 or AMX (most laptops) has oneDNN emulate bfloat16 matrix products, about
a hundred times slower than float32. This script reproduces such a CPU on one that has native
bf16 by limiting oneDNN and ATen to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`) and
runs each case in a child process of its own (both variables are read when torch loads):

  native     the machine as it is
  emulated   oneDNN and ATen limited to AVX2

Per case it prints the capability torch runs with, the 256×1024 @ 1024×256 product in float32
and bfloat16 (the case is only called emulated when the bf16 product is the slower), andrea's
bf16 verdict for it (`andrea.processor.measure`), one Muon step over the main job's 24 block
matrices orthogonalized in bfloat16 (torch's way) and in float32, and the main job's training
step (andrea-cpu in the main job's shape, recipe v3 as `andrea main` sets it up, Muon in the dtype andrea
chooses) against a bare float32 GPT-2 step of the same shape (transformers, AdamW; the peer of
`bench_train.py`), plus andrea with torch's own Muon (bf16 always) as it trained before. The
models take turns over --rounds; tokens/s come from each model's fastest step.

    .venv/bin/python benchmarks/bench_cpu_bf16.py [--rounds 3] [--steps 2] [--cases native emulated]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

CASES = {"native": {}, "emulated": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}}
ANDREA, PEER, BEFORE = "andrea (main job, v3)", "gpt2 float32 (transformers, AdamW)", "andrea with torch's Muon (bf16)"


def muon_step_seconds(dtype, repeats: int) -> float:
    """The fastest of `repeats` Muon steps over the main job's block matrices, random gradients."""
    import torch

    from andrea.config import get_preset
    from andrea.model import ANDREA as Model
    from andrea.optim import Muon, is_block_matrix

    torch.manual_seed(0)
    model = Model(get_preset("andrea-cpu"))
    mats = [p for n, p in model.named_parameters() if is_block_matrix(n, p)]
    for p in mats:
        p.grad = torch.randn_like(p)
    opt = Muon(mats, lr=6e-3, weight_decay=0.1, momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw",
               ns_dtype=dtype)
    opt.step()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - start)
    return best


def child(rounds: int, steps: int) -> dict:
    """One case, in this process: every figure of the module docstring, as JSON-ready numbers."""
    import torch
    import torch.nn.functional as F
    from bench_train import build_peer, make_step, time_steps

    from andrea.mainjob import MainJob
    from andrea.model import ANDREA as Model
    from andrea.model import tune_for_training
    from andrea.processor import measure

    verdict = measure()
    chosen = torch.bfloat16 if verdict.native else torch.float32
    out = {"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
           "f32_gflops": verdict.f32_gflops, "bf16_gflops": verdict.bf16_gflops, "native": verdict.native,
           "muon_bf16_s": muon_step_seconds(torch.bfloat16, 2), "muon_f32_s": muon_step_seconds(torch.float32, 2),
           "chosen": str(chosen).replace("torch.", "")}
    job = MainJob.on("cpu", recipe="v3")  # v3's Muon: its orthogonalization's number format is the choice under test
    shape = job.shape("cpu")
    from andrea.config import get_preset

    cfg = get_preset(shape["preset"])
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, cfg.vocab_size, (shape["batch_size"], shape["seq_len"]), generator=g) for _ in range(2))

    def andrea_step(ns_dtype):
        torch.manual_seed(0)
        model = Model(cfg)
        tune_for_training(model, torch.device("cpu"))
        opt = job.optimizer(model)
        opt.optimizers[0].ns_dtype = ns_dtype  # the choice under test (make_optimizer's own is `chosen`)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = model(x, targets=y)[1]
            loss.backward()
            opt.step()
            return loss.item()

        return step

    peer = build_peer(cfg)
    steps_of = {ANDREA: andrea_step(chosen), BEFORE: andrea_step(torch.bfloat16),
                PEER: make_step(peer, lambda x, y: F.cross_entropy(peer(input_ids=x).logits.view(-1, cfg.vocab_size),
                                                                   y.view(-1)), x, y)}
    for step in steps_of.values():
        step()  # warm-up
    times = {name: [] for name in steps_of}
    for r in range(rounds):
        order = list(steps_of) if r % 2 == 0 else list(reversed(steps_of))
        for name in order:
            # andrea as it trained before is ~10 s a step where bf16 is emulated: one step a round
            n = 1 if name == BEFORE and not verdict.native else steps
            times[name] += time_steps(steps_of[name], n)
    tokens = shape["batch_size"] * shape["seq_len"]
    out["models"] = {name: {"best_s": min(ts), "median_s": sorted(ts)[len(ts) // 2], "steps": len(ts),
                            "tokens_per_s": tokens / min(ts)} for name, ts in times.items()}
    out["shape"] = f"{shape['preset']} {shape['batch_size']} x {shape['seq_len']}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the models take turns, in reverse every other round")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per model per round")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1.")
    if args.child:
        print(json.dumps(child(args.rounds, args.steps)))
        return
    from common import machine_line

    results = {}
    for case in args.cases:
        env = {k: v for k, v in os.environ.items() if k not in CASES["emulated"] and k != "ANDREA_BF16"}
        env.update(CASES[case])
        print(f"[{case}] running {' '.join(f'{k}={v}' for k, v in CASES[case].items()) or 'as the machine is'}",
              file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--steps",
                               str(args.steps)], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"the {case} case failed:\n{done.stderr[-2000:]}")
        results[case] = json.loads(done.stdout.strip().splitlines()[-1])

    print("## The main job's step where bfloat16 is native and where it is emulated\n")
    print(f"{machine_line()}; {args.rounds} rounds × {args.steps} steps a model, after one warm-up; "
          f"tokens/s from the fastest step.\n")
    print("| case | torch capability | float32 GFLOP/s | bf16 GFLOP/s | bf16 verdict | Muon step bf16 / float32 ms | "
          "Muon in | andrea tok/s | GPT-2 tok/s | andrea / GPT-2 | before (torch's Muon) tok/s |")
    print("|---|---|---:|---:|---|---:|---|---:|---:|---:|---:|")
    for case, r in results.items():
        m = r["models"]
        print(f"| {case} | {r['capability']} | {r['f32_gflops']:.1f} | {r['bf16_gflops']:.1f} | "
              f"{'native' if r['native'] else 'emulated'} | {1e3 * r['muon_bf16_s']:,.0f} / {1e3 * r['muon_f32_s']:,.0f} | "
              f"{r['chosen']} | {m[ANDREA]['tokens_per_s']:,.0f} | {m[PEER]['tokens_per_s']:,.0f} | "
              f"{m[ANDREA]['tokens_per_s'] / m[PEER]['tokens_per_s']:.2f}× | {m[BEFORE]['tokens_per_s']:,.0f} |")
    print()
    for case, r in results.items():
        m = r["models"]
        print(f"{case}: andrea / GPT-2 {m[ANDREA]['tokens_per_s'] / m[PEER]['tokens_per_s']:.2f}× (goal ≥ 1.1×); "
              f"andrea / andrea before {m[ANDREA]['tokens_per_s'] / m[BEFORE]['tokens_per_s']:.2f}×; step ms (fastest / "
              f"median): " + ", ".join(f"{n} {1e3 * v['best_s']:,.0f} / {1e3 * v['median_s']:,.0f} ({v['steps']})"
                                       for n, v in m.items()))
    emulated = results.get("emulated")
    if emulated and emulated["native"]:
        print("note: the emulated case did not make the bf16 product slower here, so it shows nothing of such a CPU.")


if __name__ == "__main__":
    main()
