"""One part of benchmarks/gpu.sh: a training or decode measurement on synthetic ids, one table row.

    gpu_bench.py header                                  the section heading and the machine
    gpu_bench.py columns train|decode                    a table's header lines
    gpu_bench.py train --batch 8 [--compile] [--fit]     one training row: ms/step, tokens/s, MFU
    gpu_bench.py decode [--dtype bf16]                   one decode row: batch 1, KV cache, greedy

Training is the trainer's step on the GPU: bf16 autocast, TF32 matmuls, the head padded to a
multiple of 64, flash attention (SDPA's flash kernel, forced), mean cross-entropy, backward,
global-norm clipping at 1.0, fused AdamW with the v2 recipe's settings (betas 0.9/0.95, weight
decay 0.1 on matrices). The ids are random, so no corpus is needed; the speed does not depend on
them. MFU = tokens/s × FLOPs per token ÷ the device's bf16 dense peak (andrea.flops).

--dry-run runs the same code on the CPU at tiny sizes (andrea-tiny, short sequences, a few
steps), to check the script where there is no GPU; its figures say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from andrea.config import PRESETS, get_preset  # noqa: E402
from andrea.flops import flops_per_token, peak_flops  # noqa: E402
from andrea.model import ANDREA  # noqa: E402

COLUMNS = {  # (title, text column: left-aligned)
    "train": [("run", True), ("batch × seq", True), ("steps timed", True), ("ms/step (median)", False),
              ("tokens/s", False), ("TFLOP/s", False), ("MFU", False), ("peak memory", False)],
    "decode": [("decode, batch 1, KV cache, greedy", True), ("weights", True), ("prompt + new tokens", True),
               ("seconds", False), ("tokens/s", False)],
}
DRY = {"preset": "andrea-tiny", "seq": 64, "steps": 3, "warmup": 1, "new_tokens": 16}  # batch: a quarter


def device_for(dry: bool) -> torch.device:
    if dry:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench: no CUDA device is visible to torch; on a CPU, use --dry-run.")
    return torch.device("cuda")


def setup(device: torch.device) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def attention_kernel(device: torch.device):
    """Flash attention forced on the GPU (an error, not a silent fallback, if it cannot run)."""
    if device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def fused_adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=3e-4, betas=(0.9, 0.95), fused=True)


def train_once(cfg, batch: int, seq: int, steps: int, warmup: int, compile: bool, device) -> tuple[list[float], float]:
    """(seconds of each timed step, peak memory in GiB or nan)."""
    torch.manual_seed(0)
    model = ANDREA(cfg).to(device)
    if device.type == "cuda":
        model.vocab_multiple = 64
        torch.cuda.reset_peak_memory_stats()
    optimizer = fused_adamw(model)
    forward = torch.compile(model) if compile else model
    g = torch.Generator(device=device).manual_seed(0)
    batches = [torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device, generator=g) for _ in range(4)]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def step(i: int) -> None:
        ids = batches[i % len(batches)]
        with autocast, attention_kernel(device):
            _, loss = forward(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for i in range(warmup):
        step(i)
    sync(device)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(i)
        sync(device)
        times.append(time.perf_counter() - t0)
    memory = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return times, memory


def cmd_train(args) -> int:
    device = device_for(args.dry_run)
    setup(device)
    preset = DRY["preset"] if args.dry_run else args.preset
    cfg = get_preset(preset)
    seq = min(args.seq, DRY["seq"] if args.dry_run else cfg.block_size)
    batch = max(1, args.batch // 4) if args.dry_run else args.batch
    steps, warmup = (DRY["steps"], DRY["warmup"]) if args.dry_run else (args.steps, args.warmup)
    note = ""
    while True:
        try:
            times, memory = train_once(cfg, batch, seq, steps, warmup, args.compile, device)
            break
        except torch.cuda.OutOfMemoryError:
            if not args.fit or batch <= 1:
                raise
            note = note or f" ({batch} × {seq} did not fit)"
            batch //= 2
        gc.collect()  # the failed attempt's tensors, released with its traceback
        torch.cuda.empty_cache()
    tokens = batch * seq
    tps = tokens * len(times) / sum(times)
    flops = tps * flops_per_token(cfg, seq)
    peak = peak_flops(device)
    mfu = f"{100 * flops / peak:.1f}%" if peak else "no peak known for this device"
    run = f"{preset}, {'torch.compile' if args.compile else 'eager'}"
    mem = f"{memory:.1f} GiB" if memory == memory else "—"
    print(f"| {run} | {batch} × {seq}{note} | {len(times)} after {warmup} warm-up | "
          f"{1e3 * statistics.median(times):.1f} | {tps:,.0f} | {flops / 1e12:.1f} | {mfu} | {mem} |")
    return 0


def cmd_decode(args) -> int:
    from andrea.generate import generate_ids

    device = device_for(args.dry_run)
    setup(device)
    preset = DRY["preset"] if args.dry_run else args.preset
    cfg = get_preset(preset)
    new = DRY["new_tokens"] if args.dry_run else args.new_tokens
    if args.prompt_tokens + new > cfg.block_size:
        raise SystemExit(f"gpu_bench: {args.prompt_tokens} + {new} tokens do not fit the context of {cfg.block_size}.")
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = ANDREA(cfg).to(device=device, dtype=dtype).eval()
    prompt = torch.randint(257, cfg.vocab_size, (args.prompt_tokens,)).tolist()

    def run(n: int) -> list[int]:
        out = generate_ids(model, prompt, n, greedy=True, use_cache=True, stop_at_bos=False)
        sync(device)
        return out

    run(8)  # warm-up: kernels chosen, caches allocated
    t0 = time.perf_counter()
    ids = run(new)
    seconds = time.perf_counter() - t0
    assert len(ids) == new, f"asked for {new} tokens, got {len(ids)}"
    weights = "bf16" if args.dtype == "bf16" else "fp32 (TF32 matmuls)" if device.type == "cuda" else "fp32"
    print(f"| {preset} | {weights} | {args.prompt_tokens} + {new} (prefill included) | {seconds:.2f} | {new / seconds:,.1f} |")
    return 0


def cmd_header(args) -> int:
    device = device_for(args.dry_run)
    cfg = get_preset(DRY["preset"] if args.dry_run else args.preset)
    seq = DRY["seq"] if args.dry_run else cfg.block_size
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else platform.machine()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        where = (f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, "
                 f"torch {torch.__version__}; host {cpu}, {os.cpu_count()} cores")
    else:
        where = f"dry run on the CPU ({cpu}, {os.cpu_count()} cores), torch {torch.__version__}: tiny sizes, figures not meaningful"
    peak = peak_flops(device)
    peak_text = (f"{peak / 1e12:,.0f} TFLOP/s bf16 dense (andrea.flops)" if device.type == "cuda" and peak
                 else "no data-sheet peak known for this device" if device.type == "cuda"
                 else f"{peak / 1e9:,.1f} GFLOP/s, this CPU's measured fp32 matmul rate")
    print(f"## GPU: {'andrea-tiny (dry run)' if args.dry_run else args.preset} training and decode\n")
    print(f"machine: {where}; {datetime.date.today().isoformat()}\n")
    print(f"model {cfg.n_layer} layers, d {cfg.n_embd}, {cfg.n_head} heads, V {cfg.vocab_size:,}, T {cfg.block_size}; "
          f"random token ids. Training step: bf16 autocast, "
          f"{'TF32, flash attention forced in SDPA' if device.type == 'cuda' else 'SDPA as torch picks it'}, "
          f"clipping 1.0, fused AdamW. "
          f"FLOPs per token at the training rows' T = {seq}: {flops_per_token(cfg, seq) / 1e6:,.1f} M "
          f"(6·N + 12·L·T·d); MFU against {peak_text}.")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("header", "train", "decode"):
        p = sub.add_parser(name)
        p.add_argument("--preset", default="andrea-120m", choices=list(PRESETS))
        p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, to check the code path")
    columns = sub.add_parser("columns")
    columns.add_argument("table", choices=list(COLUMNS))
    t = sub.choices["train"]
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--seq", type=int, default=1024)
    t.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    t.add_argument("--warmup", type=int, default=5, help="untimed steps first, compilation included (default 5)")
    t.add_argument("--compile", action="store_true", help="torch.compile the model")
    t.add_argument("--fit", action="store_true", help="halve the batch until it fits in memory")
    d = sub.choices["decode"]
    d.add_argument("--new-tokens", type=int, default=512)
    d.add_argument("--prompt-tokens", type=int, default=16)
    d.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    args = ap.parse_args(argv)
    if args.cmd == "columns":
        cols = COLUMNS[args.table]
        print("| " + " | ".join(title for title, _ in cols) + " |")
        print("|" + "".join("---|" if text else "---:|" for _, text in cols))
        return 0
    return {"header": cmd_header, "train": cmd_train, "decode": cmd_decode}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
