"""Decode speed at batch 1: andrea's KV cache, andrea without a cache, and transformers' GPT-2.

andrea decodes as it does by default (on a CPU the decode plan's "direct" step, andrea.decoding.plan)
and, as a second arm, through its modules ("dynamic"), the same arithmetic, so what the direct
step saves is measured in the same run. The decoders take turns for --rounds rounds, in one order
and then the reverse; each is timed by its fastest round (the median is printed beside it), after
one warm-up generation each.

The peer is `transformers.GPT2LMHeadModel` of the same shape holding the same weights (GPT-2's
Conv1D stores [in, out], so our [out, in] matrices go in transposed; q, k and v are concatenated
into c_attn; every GPT-2 bias is zero; lm_head is untied). GPT-2 has no squared ReLU, so both
models use act='relu'. Both decode greedily from the same random prompt, with BOS/EOS stopping
off so every run makes the same number of tokens; the time of each includes its prefill.

    .venv/bin/python benchmarks/bench_decode.py                  # andrea-12m shape, 512 new tokens
    .venv/bin/python benchmarks/bench_decode.py --preset andrea-cpu --new-tokens 224   # the main job's model
    .venv/bin/python benchmarks/bench_decode.py --no-cache-tokens 128   # shorter no-cache run
    .venv/bin/python benchmarks/bench_decode.py --rounds 5             # more rounds on a noisy machine
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

import torch

from andrea.config import get_preset
from andrea.decoding.generate import generate_ids
from andrea.model import ANDREA


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpt2_peer(model: ANDREA):
    """A transformers GPT2LMHeadModel with model's weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.config
    hf_cfg = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                        n_layer=cfg.n_layer, n_head=cfg.n_head, n_inner=4 * cfg.n_embd, activation_function="relu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                        tie_word_embeddings=False, bos_token_id=256, eos_token_id=None, pad_token_id=0)
    peer = GPT2LMHeadModel(hf_cfg).eval()
    with torch.no_grad():
        for p in peer.parameters():
            p.zero_()
        t = peer.transformer
        t.wte.weight.copy_(model.wte.weight)
        t.wpe.weight.copy_(model.wpe.weight)
        for ours, theirs in zip(model.h, t.h):
            a = ours.attn
            for name in ("ln_1", "ln_2"):
                getattr(theirs, name).weight.copy_(getattr(ours, name).weight)
                getattr(theirs, name).bias.copy_(getattr(ours, name).bias)
            theirs.attn.c_attn.weight.copy_(torch.cat([a.wq.weight, a.wk.weight, a.wv.weight]).T)
            theirs.attn.c_proj.weight.copy_(a.wo.weight.T)
            theirs.mlp.c_fc.weight.copy_(ours.mlp.fc1.weight.T)
            theirs.mlp.c_proj.weight.copy_(ours.mlp.fc2.weight.T)
        t.ln_f.weight.copy_(model.ln_f.weight)
        t.ln_f.bias.copy_(model.ln_f.bias)
        peer.lm_head.weight.copy_(model.lm_head.weight)
    assert peer.lm_head.weight.data_ptr() != t.wte.weight.data_ptr(), "the peer's head must be untied"
    return peer


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="andrea-12m")
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--no-cache-tokens", type=int, default=None, help="new tokens for the no-cache run (default: --new-tokens)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the decoders take turns, in one order and then "
                    "the reverse, and each is timed by its fastest round")
    args = ap.parse_args()
    if args.rounds < 1 or args.new_tokens < 1 or args.prompt_tokens < 1 or (args.no_cache_tokens or 1) < 1:
        ap.error("--rounds, --new-tokens, --prompt-tokens and --no-cache-tokens must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    torch.manual_seed(0)
    cfg = get_preset(args.preset).replace(act="relu")
    model = ANDREA(cfg).eval()
    peer = gpt2_peer(model)
    prompt = torch.randint(257, cfg.vocab_size, (args.prompt_tokens,)).tolist()
    n, n_nc = args.new_tokens, args.no_cache_tokens or args.new_tokens

    def ours(k, use_cache=True, decode="auto"):
        return generate_ids(model, prompt, k, greedy=True, use_cache=use_cache, stop_at_bos=False, decode=decode)

    def theirs(k):
        x = torch.tensor([prompt])
        with torch.inference_mode():
            out = peer.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=k, min_new_tokens=k,
                                do_sample=False, use_cache=True)
        return out[0, len(prompt):].tolist()

    with torch.inference_mode():  # the peer's logits on the prompt, to show the weights match
        ref = model(torch.tensor([prompt]))[0]
        hf = peer(torch.tensor([prompt])).logits
    max_diff = (ref - hf).abs().max().item()
    OURS, MODULES, NO_CACHE, PEER = ("andrea, KV cache", "andrea, KV cache through the modules (decode dynamic)",
                                     "andrea, no cache", "transformers GPT2LMHeadModel.generate (cache)")
    decoders = {OURS: (n, lambda: ours(n)), MODULES: (n, lambda: ours(n, decode="dynamic")),
                NO_CACHE: (n_nc, lambda: ours(n_nc, use_cache=False)), PEER: (n, lambda: theirs(n))}
    ids, seconds = {}, {name: [] for name in decoders}
    for _, run in decoders.values():  # warm up (andrea's first generation also lays its weights out)
        run()
    names = list(decoders)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            ids[name], t = timed(decoders[name][1])
            seconds[name].append(t)
    ids_cache, ids_peer, ids_nc, ids_dyn = ids[OURS], ids[PEER], ids[NO_CACHE], ids[MODULES]
    tps = {name: decoders[name][0] / min(seconds[name]) for name in names}
    tps_cache, tps_peer, tps_nc = tps[OURS], tps[PEER], tps[NO_CACHE]
    agree_peer = ids_cache == ids_peer
    agree_nc = ids_cache[:n_nc] == ids_nc
    first_diff = next((i for i, (a, b) in enumerate(zip(ids_cache, ids_peer)) if a != b), None)

    print(f"## Decode at batch 1: {args.preset} shape (d {cfg.n_embd}, {cfg.n_layer} layers, {cfg.n_head} heads, "
          f"T {cfg.block_size}, V {cfg.vocab_size:,}, act relu), fp32 CPU, greedy")
    print()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}; "
          f"{datetime.date.today().isoformat()}")
    print(f"prompt {len(prompt)} tokens; new tokens {n} (no-cache run {n_nc}); peer attention "
          f"{getattr(peer.config, '_attn_implementation', '?')}; {args.rounds} rounds, tokens/s from each "
          f"decoder's fastest")
    print()
    print("| decoder | new tokens | seconds, fastest | seconds, median | tokens/s | vs transformers | vs andrea no cache |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        t = seconds[name]
        print(f"| {name} | {decoders[name][0]} | {min(t):.3f} | {statistics.median(t):.3f} | {tps[name]:.1f} | "
              f"{tps[name] / tps_peer:.2f}× | {tps[name] / tps_nc:.2f}× |")
    print()
    by_round = [theirs_s / ours_s for ours_s, theirs_s in zip(seconds[OURS], seconds[PEER])]
    print(f"andrea's direct step against its module path (decode dynamic): {tps_cache / tps[MODULES]:.2f}×")
    print(f"andrea (cache) against transformers, round by round: median {statistics.median(by_round):.2f}× "
          f"(rounds {', '.join(f'{r:.2f}×' for r in by_round)})")
    print(f"prompt logits, andrea vs transformers: max |diff| {max_diff:.2e}")
    print(f"greedy tokens, andrea (cache) vs transformers: {'identical' if agree_peer else f'differ from token {first_diff}'} "
          f"({n} tokens)")
    print(f"greedy tokens, andrea cache vs no cache: {'identical' if agree_nc else 'differ'} ({n_nc} tokens)")
    print(f"greedy tokens, andrea direct vs through the modules: {'identical' if ids_dyn == ids_cache else 'differ'} "
          f"({n} tokens)")
    print(f"targets: >= 2.5× transformers: {'met' if tps_cache >= 2.5 * tps_peer else 'not met'} "
          f"({tps_cache / tps_peer:.2f}×); >= 5× no cache: {'met' if tps_cache >= 5 * tps_nc else 'not met'} "
          f"({tps_cache / tps_nc:.2f}×)")


if __name__ == "__main__":
    main()
