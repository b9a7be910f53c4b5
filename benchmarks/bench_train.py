"""Training-step throughput of ANDREA against transformers' GPT2LMHeadModel of the same shape.

One step = forward, mean cross-entropy, backward, AdamW step; fp32 on the CPU with every core.
andrea runs as `andrea train` sets it up (`andrea.model.tune_for_training`: the head's matmul
padded to 16 rows; the loss in blocks of rows, `andrea.loss.ChunkedCrossEntropy`).
The peer has the same width, depth, heads, context and vocabulary, an untied head, the same
activation (relu2 where ANDREA uses it), no dropout and SDPA attention; it differs in having
biases on its linear layers (ANDREA's have none). Both compute the loss with the same
`F.cross_entropy` call on their logits, and both use AdamW with torch's defaults and lr 3e-4.

FLOPs per token F = 6·N + 12·L·T·d, with N all of ANDREA's parameters but the two lookup tables
wte and wpe (the output head and the norm weights count) and 12·L·T·d the QKᵀ and AV products over
the full T×T square (as nanoGPT and PaLM count them). The same F is used for both models: the
peer's biases add no matmul work. The reference rate is a 2048² fp32 torch.mm with every thread,
measured once per round between the steps so that it shares their conditions on a shared machine;
like the step times, the best measurement is the one reported.

With --bf16 two more arms run andrea and the peer with their forward (and so their backward) under
bfloat16 autocast, float32 weights and optimizer: how `andrea train` runs where the CPU computes
bfloat16 natively (`andrea.processor`). Their share of the matmul rate is taken against a bfloat16
2048² torch.mm, measured the same way. A third bf16 arm runs andrea with its attention in the
other kernel: where a bf16 CPU step computes attention in plain products (`causal_attention`, up
to `PLAIN_ATTENTION_MAX_T`), in SDPA's, as it trained before; at longer windows, in plain
products. So what the choice buys at --seq is measured in the same run.

A third arm runs andrea as it trained before the loss went into blocks and the head was padded
(the loss from whole logits, `loss_chunk = 0`; `vocab_multiple = 1`), so that what those two
changes buy is measured in the same run, beside the same peer.

With --compile a fourth arm runs andrea through `torch.compile` (inductor; on the CPU it generates
C++ with the machine's compiler): the same weights, data and optimizer; its first step, which
compiles the forward and backward graphs, is timed apart and printed as the compile time.

    .venv/bin/python benchmarks/bench_train.py [--preset andrea-12m] [--batch 6] [--seq 256] [--compile]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import cpu_name  # noqa: E402  (benchmarks/common.py, beside this script)

from andrea.config import PRESETS, count_params  # noqa: E402
from andrea.model import ANDREA, tune_for_training  # noqa: E402

PEER_ACTIVATION = {"relu2": "relu2", "relu": "relu", "gelu": "gelu"}
PEER = "gpt2 (transformers)"
COMPILED = "andrea (torch.compile)"
OURS_BF16, PEER_BF16 = "andrea (bf16 autocast)", "gpt2 (transformers, bf16 autocast)"
PLAIN = "andrea, whole loss, unpadded head"
OTHER_BF16 = "andrea (bf16 autocast, attention in {})"


def matmul_rate(n: int = 2048, seconds: float = 0.5, dtype=torch.float32) -> float:
    """FLOP/s of an n×n torch.mm in `dtype`, repeated for about `seconds`."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        reps += 1
    return 2 * n**3 * reps / (time.perf_counter() - start)


def load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def build_peer(cfg):
    from transformers import GPT2Config, GPT2LMHeadModel

    peer_cfg = GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, activation_function=PEER_ACTIVATION[cfg.act], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=False, bos_token_id=256, eos_token_id=256,
        attn_implementation="sdpa",
    )
    peer = GPT2LMHeadModel(peer_cfg)
    assert peer.config._attn_implementation == "sdpa", "the peer does not use SDPA attention"
    assert peer.lm_head.weight.data_ptr() != peer.transformer.wte.weight.data_ptr(), "the peer's head is tied"
    return peer


def make_step(model, loss_of, x, y, bf16: bool = False):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(x, y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def other_kernel(step, seq: int):
    """`step` with andrea's training attention in the kernel it does not choose at `seq` tokens:
    SDPA where it chooses plain products, plain products where it chooses SDPA; and that kernel's name."""
    import andrea.model

    plain = seq <= andrea.model.PLAIN_ATTENTION_MAX_T
    limit = 0 if plain else seq

    def other_step() -> float:
        keep, andrea.model.PLAIN_ATTENTION_MAX_T = andrea.model.PLAIN_ATTENTION_MAX_T, limit
        try:
            return step()
        finally:
            andrea.model.PLAIN_ATTENTION_MAX_T = keep

    return other_step, "SDPA" if plain else "plain products"


def time_steps(step, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="andrea-12m", choices=list(PRESETS))
    parser.add_argument("--batch", type=int, default=6, help="sequences per step (default 6)")
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence (default 256)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the models run in one order, then in reverse, by turns")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per model per round")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default all cores)")
    parser.add_argument("--compile", action="store_true", help="also time andrea under torch.compile (compile time apart)")
    parser.add_argument("--bf16", action="store_true", help="also time andrea and the peer under bfloat16 autocast, as "
                                                            "andrea train runs where the CPU computes bfloat16 natively")
    args = parser.parse_args()

    cfg = PRESETS[args.preset]
    if not 1 <= args.seq <= cfg.block_size:
        parser.error(f"--seq must be in 1..{cfg.block_size} (the context of {args.preset}).")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    ours = ANDREA(cfg)
    tune_for_training(ours, torch.device("cpu"))  # as `andrea train` sets it: the head padded to 16 rows
    peer = build_peer(cfg)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=g)
    y = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=g)
    steps = {
        "andrea": make_step(ours, lambda x, y: ours(x, targets=y)[1], x, y),
        PEER: make_step(
            peer, lambda x, y: F.cross_entropy(peer(input_ids=x).logits.view(-1, cfg.vocab_size), y.view(-1)), x, y
        ),
    }
    plain = ANDREA(cfg)
    plain.load_state_dict(ours.state_dict())
    plain.loss_chunk, plain.vocab_multiple = 0, 1
    steps[PLAIN] = make_step(plain, lambda x, y: plain(x, targets=y)[1], x, y)
    n_params = {"andrea": ours.num_params(), PEER: sum(p.numel() for p in peer.parameters()), PLAIN: plain.num_params()}
    other = None  # the bf16 arm in the kernel andrea does not choose
    if args.bf16:  # copies of the same weights, each with its own optimizer
        ours16, peer16 = ANDREA(cfg), build_peer(cfg)
        ours16.load_state_dict(ours.state_dict())
        tune_for_training(ours16, torch.device("cpu"))
        peer16.load_state_dict(peer.state_dict())
        steps[OURS_BF16] = make_step(ours16, lambda x, y: ours16(x, targets=y)[1], x, y, bf16=True)
        steps[PEER_BF16] = make_step(
            peer16, lambda x, y: F.cross_entropy(peer16(input_ids=x).logits.view(-1, cfg.vocab_size), y.view(-1)), x, y,
            bf16=True)
        other16 = ANDREA(cfg)
        other16.load_state_dict(ours.state_dict())
        tune_for_training(other16, torch.device("cpu"))
        other_step, kernel = other_kernel(make_step(other16, lambda x, y: other16(x, targets=y)[1], x, y, bf16=True),
                                         args.seq)
        other = OTHER_BF16.format(kernel)
        steps[other] = other_step
        n_params[OURS_BF16], n_params[PEER_BF16], n_params[other] = n_params["andrea"], n_params[PEER], n_params["andrea"]
    compile_s = None
    if args.compile:
        compiled = ANDREA(cfg)
        compiled.load_state_dict(ours.state_dict())
        tune_for_training(compiled, torch.device("cpu"))
        forward = torch.compile(compiled)
        steps[COMPILED] = make_step(compiled, lambda x, y: forward(x, targets=y)[1], x, y)
        n_params[COMPILED] = compiled.num_params()
        start = time.perf_counter()
        steps[COMPILED]()  # compiles the forward and backward graphs
        compile_s = time.perf_counter() - start

    load_before = load_average()
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    # the matmul rate is measured in every round too, so that it shares the steps' conditions
    times, rates, rates16 = {name: [] for name in steps}, [], []
    for r in range(args.rounds):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))
        for name in order:
            times[name] += time_steps(steps[name], args.steps)
        rates.append(matmul_rate())
        if args.bf16:
            rates16.append(matmul_rate(dtype=torch.bfloat16))
    peak = max(rates)
    peaks = {name: (max(rates16) if name in (OURS_BF16, PEER_BF16, other) else peak) for name in steps}
    load_after = load_average()

    d, L, T = cfg.n_embd, cfg.n_layer, args.seq
    lookups = cfg.vocab_size * d + (cfg.block_size * d if cfg.pos == "learned" else 0)
    n_mm = count_params(cfg) - lookups
    flops_tok = 6 * n_mm + 12 * L * T * d
    tokens = args.batch * args.seq

    # the fastest step is the one least disturbed by other work on the machine (as timeit advises)
    rows = {}
    for name, ts in times.items():
        tps = tokens / min(ts)
        rows[name] = (min(ts), statistics.median(ts), tps, flops_tok * tps / 1e9)
    ratio = rows["andrea"][2] / rows[PEER][2]

    import transformers

    print(f"## Training step, {args.preset} shape, CPU{' (fp32, and bf16 autocast)' if args.bf16 else ', fp32'}\n")
    print("| machine | value |\n|---|---|")
    print(f"| cpu | {cpu_name()} |")
    print(f"| cores / torch threads | {os.cpu_count()} / {torch.get_num_threads()} |")
    print(f"| torch / transformers | {torch.__version__} / {transformers.__version__} |")
    print(f"| date | {datetime.date.today().isoformat()} |")
    print(f"| shape | d {d}, heads {cfg.n_head}, layers {L}, V {cfg.vocab_size:,}, context {cfg.block_size}, "
          f"act {cfg.act} |")
    print(f"| batch | {args.batch} × {args.seq} = {tokens:,} tokens per step |")
    print(f"| steps timed | {args.rounds * args.steps} per model, after {args.warmup} warm-up; tokens/s from the fastest |")
    print(f"| FLOPs per token | 6·N + 12·L·T·d = 6 × {n_mm:,} + 12 × {L} × {T} × {d} = {flops_tok / 1e6:.1f} M |")
    print(f"| fp32 matmul rate (2048² torch.mm, best of rounds) | {peak / 1e9:.1f} GFLOP/s |")
    if args.bf16:
        print(f"| bf16 matmul rate (the same, in bfloat16) | {max(rates16) / 1e9:.1f} GFLOP/s |")
    print(f"| load average (1 min) before / after | {load_before} / {load_after} |")
    if compile_s is not None:
        print(f"| torch.compile: the first step (compiling forward and backward) | {compile_s:.1f} s |")
    print()
    print("| model | params | step ms (fastest) | step ms (median) | tokens/s | GFLOP/s | of matmul rate |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (best, med, tps, gflops) in rows.items():
        print(f"| {name} | {n_params[name]:,} | {best * 1e3:.0f} | {med * 1e3:.0f} | {tps:,.0f} | {gflops:.1f} | "
              f"{100 * gflops * 1e9 / peaks[name]:.0f}% |")
    print()
    print(f"andrea / gpt2 tokens per second: {ratio:.2f}×")
    print(f"andrea / andrea with the whole loss and an unpadded head tokens per second: "
          f"{rows['andrea'][2] / rows[PLAIN][2]:.2f}×")
    if args.bf16:
        print(f"andrea / gpt2 tokens per second, both under bf16 autocast: {rows[OURS_BF16][2] / rows[PEER_BF16][2]:.2f}×")
        print(f"andrea under bf16 autocast / andrea in fp32 tokens per second: {rows[OURS_BF16][2] / rows['andrea'][2]:.2f}×")
        print(f"andrea under bf16 autocast / the same with attention in {kernel} tokens per second: "
              f"{rows[OURS_BF16][2] / rows[other][2]:.2f}×")
    if compile_s is not None:
        print(f"andrea compiled / gpt2 tokens per second: {rows[COMPILED][2] / rows[PEER][2]:.2f}×")
        print(f"andrea compiled / andrea eager tokens per second: {rows[COMPILED][2] / rows['andrea'][2]:.2f}×")


if __name__ == "__main__":
    main()
