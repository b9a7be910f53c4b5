"""One part of benchmarks/gpu.sh: training or decoding on a GPU beside transformers, as table rows.

    gpu_bench.py header                                  the section heading and the machine
    gpu_bench.py columns train|decode|cli                a table's header lines
    gpu_bench.py train --batch 8 [--compile] [--fit]     training rows: andrea, then its peer
    gpu_bench.py decode [--dtype bf16]                   decode rows: batch 1, greedy, every plan
    gpu_bench.py cli [--data DIR]                        `andrea train` + `andrea generate` rows

Training is the trainer's step: bf16 autocast, TF32 matmuls, the head padded to a multiple of 64,
flash attention (SDPA's flash kernel, forced), mean cross-entropy, backward, global-norm
clipping at 1.0, fused AdamW with the v2 recipe's settings (betas 0.9/0.95, weight decay 0.1 on
matrices). `--models` picks the rows: `andrea` (the loss in blocks of rows, the CUDA default),
`andrea-whole-loss` (the whole batch's logits, then cross-entropy) and `gpt2`, transformers'
GPT2LMHeadModel of the same shape (untied head, relu², SDPA with the kernel SDPA picks, no
dropout; it adds biases), run through the same step with the same cross-entropy call on its logits. Random ids: no corpus is
needed, and the speed does not depend on them. MFU = tokens/s × FLOPs per token ÷ the device's
bf16 dense peak (andrea.flops); the peer is credited with the same FLOPs per token.

Decoding is batch 1, greedy, from a random prompt, with the same weights in andrea and in a
GPT2LMHeadModel (act relu in both: GPT-2's weights copied from ours, as in bench_decode.py).
Rows: andrea's decode plan in each mode (graph: the one-token step replayed as a CUDA graph;
static: the same fixed-shape step run eagerly; dynamic: the key length grows a token at a time)
and transformers' `generate`. Every time includes its prefill (and the graph's capture).

`cli` trains andrea-12m at 32 × 1024 for --seconds with `andrea train` on the main job's shards
(`--data`, else the newest shard folder in the cache), then times `andrea generate` on the run.

--dry-run runs the same code on the CPU at tiny sizes (andrea-tiny, short sequences, a few
steps; torch.compile with the aot_eager backend, which traces but generates no code), to check
the script where there is no GPU; its figures say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from andrea.config import PRESETS, get_preset  # noqa: E402
from andrea.flops import flops_per_token, peak_flops  # noqa: E402
from andrea.model import ANDREA  # noqa: E402

COLUMNS = {  # (title, text column: left-aligned)
    "train": [("model", True), ("run", True), ("batch × seq", True), ("steps timed", True),
              ("ms/step (median)", False), ("tokens/s", False), ("TFLOP/s", False), ("MFU", False),
              ("peak memory", False), ("vs transformers", False)],
    "decode": [("decoder, batch 1, greedy", True), ("weights", True), ("prompt + new tokens", True),
               ("seconds", False), ("tokens/s", False), ("vs transformers", False),
               ("tokens equal to andrea graph's", True)],
    "cli": [("command", True), ("settings", True), ("result", True)],
}
DRY = {"preset": "andrea-tiny", "seq": 64, "steps": 3, "warmup": 1, "new_tokens": 16}  # batch: a quarter
MODELS = ("andrea", "andrea-whole-loss", "gpt2")


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


def fused_adamw(model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=3e-4, betas=(0.9, 0.95), fused=device.type == "cuda")


def build(name: str, cfg, device: torch.device):
    """(module, loss function of (ids, targets)) for one of MODELS."""
    if name == "gpt2":
        from bench_train import build_peer

        peer = build_peer(cfg).to(device)
        return peer, lambda x, y: F.cross_entropy(peer(x).logits.float().flatten(0, 1), y.flatten())
    model = ANDREA(cfg).to(device)
    if device.type == "cuda":
        model.vocab_multiple = 64
    model.loss_chunk = 0 if name == "andrea-whole-loss" else None
    return model, lambda x, y: model(x, y)[1]


def train_once(name, cfg, batch: int, seq: int, steps: int, warmup: int, compile: bool, device) -> tuple[list[float], float]:
    """(seconds of each timed step, peak memory in GiB or nan)."""
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    model, loss_of = build(name, cfg, device)
    optimizer = fused_adamw(model, device)
    if compile:  # on a CPU (the dry run) dynamo and autograd are traced, but nothing is code-generated
        loss_of = torch.compile(loss_of, backend="inductor" if device.type == "cuda" else "aot_eager")
    g = torch.Generator(device=device).manual_seed(0)
    batches = [torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device, generator=g) for _ in range(4)]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    kernel = attention_kernel if name != "gpt2" else lambda device: nullcontext()  # the peer: SDPA's own choice

    def step(i: int) -> None:
        ids = batches[i % len(batches)]
        with autocast, kernel(device):
            loss = loss_of(ids[:, :-1], ids[:, 1:])
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


def free(device: torch.device) -> None:
    gc.collect()  # a finished or failed run's tensors
    if device.type == "cuda":
        torch.cuda.empty_cache()


def cmd_train(args) -> int:
    device = device_for(args.dry_run)
    setup(device)
    preset = DRY["preset"] if args.dry_run else args.preset
    cfg = get_preset(preset)
    seq = min(args.seq, DRY["seq"] if args.dry_run else cfg.block_size)
    batch = max(1, args.batch // 4) if args.dry_run else args.batch
    steps, warmup = (DRY["steps"], DRY["warmup"]) if args.dry_run else (args.steps, args.warmup)
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"gpu_bench: unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}.")
    note, results = "", {}
    for name in names:  # the first fits the batch; the others run at the batch it found
        while True:
            try:
                results[name] = train_once(name, cfg, batch, seq, steps, warmup, args.compile, device)
                break
            except torch.cuda.OutOfMemoryError:
                if not args.fit or batch <= 1 or results:
                    raise
                note = note or f" ({batch} × {seq} did not fit)"
                batch //= 2
            free(device)
        free(device)
    tokens = batch * seq
    peak = peak_flops(device)
    tps = {name: tokens * len(times) / sum(times) for name, (times, _) in results.items()}
    for name, (times, memory) in results.items():
        flops = tps[name] * flops_per_token(cfg, seq)
        mfu = f"{100 * flops / peak:.1f}%" if peak else "no peak known"
        mem = f"{memory:.1f} GiB" if memory == memory else "—"
        ratio = f"{tps[name] / tps['gpt2']:.2f}×" if "gpt2" in tps else "—"
        print(f"| {name} | {preset}, {'torch.compile' if args.compile else 'eager'} | {batch} × {seq}{note} | "
              f"{len(times)} after {warmup} warm-up | {1e3 * statistics.median(times):.1f} | {tps[name]:,.0f} | "
              f"{flops / 1e12:.1f} | {mfu} | {mem} | {ratio} |")
    return 0


def cmd_decode(args) -> int:
    from bench_decode import gpt2_peer

    from andrea.decoding.generate import generate_ids
    from andrea.decoding.plan import DecodePlan

    device = device_for(args.dry_run)
    setup(device)
    preset = DRY["preset"] if args.dry_run else args.preset
    cfg = get_preset(preset).replace(act="relu")  # GPT-2 has no relu²: both use relu
    new = DRY["new_tokens"] if args.dry_run else args.new_tokens
    if args.prompt_tokens + new > cfg.block_size:
        raise SystemExit(f"gpu_bench: {args.prompt_tokens} + {new} tokens do not fit the context of {cfg.block_size}.")
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = ANDREA(cfg).eval()
    peer = gpt2_peer(model).to(device=device, dtype=dtype)
    model = model.to(device=device, dtype=dtype)
    prompt = torch.randint(257, cfg.vocab_size, (args.prompt_tokens,)).tolist()

    def ours(mode: str, n: int) -> list[int]:
        out = generate_ids(model, prompt, n, greedy=True, stop_at_bos=False, decode=mode)
        sync(device)
        return out

    def theirs(n: int) -> list[int]:
        x = torch.tensor([prompt], device=device)
        with torch.inference_mode():
            out = peer.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, use_cache=True)
        sync(device)
        return out[0, len(prompt):].tolist()

    def timed(fn, *a):
        fn(*a[:-1], 8)  # warm-up: kernels chosen, libraries loaded
        t0 = time.perf_counter()
        ids = fn(*a)
        seconds = time.perf_counter() - t0
        assert len(ids) == a[-1], f"asked for {a[-1]} tokens, got {len(ids)}"
        return ids, seconds

    rows = [(f"andrea, {mode}", *timed(ours, mode, new)) for mode in ("graph", "static", "dynamic")]
    peer_new = min(new, args.peer_tokens) if args.peer_tokens else new
    rows.append(("transformers GPT2LMHeadModel.generate", *timed(theirs, peer_new)))
    plan = DecodePlan(model, max_len=args.prompt_tokens + 2, mode="graph")
    plan.step(int(plan.prefill(prompt[:1]).argmax()))
    graph_note = "" if plan.graph is not None else f" (no graph: {plan.fallback})"
    reference = rows[0][1]
    peer_tps = len(rows[-1][1]) / rows[-1][2]
    weights = "bf16" if args.dtype == "bf16" else "fp32 (TF32 matmuls)" if device.type == "cuda" else "fp32"
    for name, ids, seconds in rows:
        same = next((i for i, (a, b) in enumerate(zip(ids, reference)) if a != b), len(ids))
        agree = "all" if same == len(ids) else f"first {same} of {len(ids)}"
        name = name + graph_note if name == "andrea, graph" else name
        print(f"| {name} | {weights} | {args.prompt_tokens} + {len(ids)} | {seconds:.2f} | {len(ids) / seconds:,.1f} | "
              f"{len(ids) / seconds / peer_tps:.2f}× | {agree} |")
    return 0


def shard_folder(data: str | None) -> Path | None:
    """--data, or the newest shard folder the main job left in the cache (None if there is none)."""
    if data:
        return Path(data)
    from andrea.cache import cache_root

    found = sorted((cache_root() / "shards").glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None



def last_step_and_bpb(run: Path) -> tuple[dict, float | None]:
    """A run's last step row and its last evaluation's bits per byte, read through andrea's gate."""
    from andrea.metrics import read_metrics

    rows = read_metrics(run / "metrics.jsonl")
    steps = [r for r in rows if "tok_per_s" in r]
    evals = [r for r in rows if "eval" in r]
    return (steps[-1] if steps else {}), (evals[-1]["eval"]["all"]["bpb"] if evals else None)

def cmd_cli(args) -> int:
    from andrea.cache import cache_root

    device = device_for(args.dry_run)
    data = shard_folder(args.data)
    if data is None:
        print(f"| andrea train | | skipped: no main-job shards in {cache_root() / 'shards'} (run `andrea main` once, "
              f"or pass --data DIR) |")
        return 0
    preset, batch, seq = ("andrea-tiny", 2, 64) if args.dry_run else (args.preset, args.batch, args.seq)
    limit = ["--max-steps", "3"] if args.dry_run else ["--time-limit", str(args.seconds)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        run = Path(tmp) / "run"
        # the model's body with the shards' vocabulary (the main job's segments on the GPU too), so any
        # prepared folder does
        from andrea.shards import open_token_data

        get_preset(preset).replace(vocab_size=open_token_data(data).vocab_size).save(Path(tmp) / "model.json")
        model = ["--model-config", str(Path(tmp) / "model.json")]
        train = [sys.executable, "-m", "andrea", "train", "--data", str(data), "--out", str(run), *model,
                 "--batch-size", str(batch), "--seq-len", str(seq), *limit, "--warmup-steps", "50",
                 "--no-audit", "--no-progress"] + (["--compile"] if args.compile else [])
        t0 = time.perf_counter()
        done = subprocess.run(train, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        settings = f"{preset} (V {open_token_data(data).vocab_size:,}), {batch} × {seq}, {' '.join(limit)}{', --compile' if args.compile else ''}; {data.name}"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1].replace("|", "/")
            print(f"| andrea train | {settings} | failed (exit {done.returncode}): {last} |")
            return 0
        last, bpb = last_step_and_bpb(run)
        mfu = last.get("mfu")
        print(f"| andrea train | {settings} | {last.get('step', '?')} steps, {wall:.0f} s wall; last window "
              f"{last.get('tok_per_s', float('nan')):,.0f} tokens/s, MFU {'?' if mfu is None else f'{100 * mfu:.1f}%'}; "
              f"validation {'?' if bpb is None else f'{bpb:.3f}'} bits/byte |")
        generate = [sys.executable, "-m", "andrea", "generate", "--checkpoint", str(run), "--greedy",
                    "--max-new-tokens", str(DRY["new_tokens"] if args.dry_run else args.new_tokens),
                    "--prompt", "The people of the United States"]
        t0 = time.perf_counter()
        done = subprocess.run(generate, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1].replace("|", "/")
            print(f"| andrea generate | greedy | failed (exit {done.returncode}): {last} |")
            return 0
        text = " ".join(done.stdout.split())[:60].replace("|", "/")
        print(f"| andrea generate | greedy, {generate[-3]} new tokens at most, {device.type} | {wall:.1f} s wall "
              f"(start-up and checkpoint load included): “{text}…” |")
    return 0


def cmd_header(args) -> int:
    if args.plan:
        cfg = get_preset(args.preset)
        print(f"## GPU: {args.preset} training and decode\n")
        print(f"**Unmeasured**: no CUDA device was visible to torch {torch.__version__} where this section was "
              f"written ({datetime.date.today().isoformat()}); every row below "
              f"says so. `benchmarks/gpu.sh` on a machine with an NVIDIA GPU measures them.\n")
        print(f"model {cfg.n_layer} layers, d {cfg.n_embd}, {cfg.n_head} heads, V {cfg.vocab_size:,}, "
              f"T {cfg.block_size}; FLOPs per token at T = {cfg.block_size}: "
              f"{flops_per_token(cfg, cfg.block_size) / 1e6:,.1f} M (6·N + 12·L·T·d).")
        return 0
    device = device_for(args.dry_run)
    cfg = get_preset(DRY["preset"] if args.dry_run else args.preset)
    seq = DRY["seq"] if args.dry_run else cfg.block_size
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else platform.machine()
    try:
        import transformers

        peer = f"transformers {transformers.__version__}"
    except ImportError:
        peer = "transformers not installed (its rows will fail)"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        where = (f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, "
                 f"torch {torch.__version__}, {peer}; host {cpu}, {os.cpu_count()} cores")
    else:
        where = (f"dry run on the CPU ({cpu}, {os.cpu_count()} cores), torch {torch.__version__}, {peer}: "
                 f"tiny sizes, figures not meaningful")
    peak = peak_flops(device)
    peak_text = (f"{peak / 1e12:,.0f} TFLOP/s bf16 dense (andrea.flops)" if device.type == "cuda" and peak
                 else "no data-sheet peak known for this device" if device.type == "cuda"
                 else f"{peak / 1e9:,.1f} GFLOP/s, this CPU's measured fp32 matmul rate")
    print(f"## GPU: {'andrea-tiny (dry run)' if args.dry_run else args.preset} training and decode\n")
    print(f"machine: {where}; {datetime.date.today().isoformat()}\n")
    print(f"model {cfg.n_layer} layers, d {cfg.n_embd}, {cfg.n_head} heads, V {cfg.vocab_size:,}, T {cfg.block_size}; "
          f"random token ids. Training step: bf16 autocast, "
          f"{'TF32, flash attention forced in SDPA' if device.type == 'cuda' else 'SDPA as torch picks it'}, "
          f"clipping 1.0, AdamW (fused on CUDA). "
          f"FLOPs per token at the training rows' T = {seq}: {flops_per_token(cfg, seq) / 1e6:,.1f} M "
          f"(6·N + 12·L·T·d); MFU against {peak_text}.")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("header", "train", "decode", "cli"):
        p = sub.add_parser(name)
        p.add_argument("--preset", default="andrea-12m" if name == "cli" else "andrea-120m", choices=list(PRESETS))
        p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, to check the code path")
    sub.choices["header"].add_argument("--plan", action="store_true", help="the heading of a section left unmeasured")
    columns = sub.add_parser("columns")
    columns.add_argument("table", choices=list(COLUMNS))
    t = sub.choices["train"]
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--seq", type=int, default=1024)
    t.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    t.add_argument("--warmup", type=int, default=5, help="untimed steps first, compilation included (default 5)")
    t.add_argument("--compile", action="store_true", help="torch.compile the forward and loss")
    t.add_argument("--fit", action="store_true", help="halve the batch until the first model fits in memory")
    t.add_argument("--models", default="andrea,gpt2", help=f"comma-separated, from {', '.join(MODELS)} (default andrea,gpt2)")
    d = sub.choices["decode"]
    d.add_argument("--new-tokens", type=int, default=512)
    d.add_argument("--prompt-tokens", type=int, default=16)
    d.add_argument("--peer-tokens", type=int, default=None, help="fewer new tokens for transformers' run (default: the same)")
    d.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    c = sub.choices["cli"]
    c.add_argument("--data", default=None, help="a shard folder (default: the newest in the cache)")
    c.add_argument("--batch", type=int, default=32)
    c.add_argument("--seq", type=int, default=1024)
    c.add_argument("--seconds", type=int, default=40, help="training time limit (default 40)")
    c.add_argument("--new-tokens", type=int, default=256)
    c.add_argument("--compile", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "columns":
        cols = COLUMNS[args.table]
        print("| " + " | ".join(title for title, _ in cols) + " |")
        print("|" + "".join("---|" if text else "---:|" for _, text in cols))
        return 0
    return {"header": cmd_header, "train": cmd_train, "decode": cmd_decode, "cli": cmd_cli}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
