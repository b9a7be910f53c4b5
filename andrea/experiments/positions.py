"""The positions experiment: learned vs sinusoidal vs rope vs no positions, on the same data.

Four models that differ only in `pos` are trained by `andrea.train.train` on identical data,
steps, batch order and seed, at sequence length S. Each model's context is 2S, so that after
training the same validation windows of 2S tokens can be run through every one of them:

    val bpb         bits per byte on positions 0 .. S-1 of the windows: the trained length
                    (the model is causal, so these positions see exactly an S-token window)
    shuffled bpb    the first S + 1 tokens of each window in a random order (the same order
                    for every model): how much the model relies on word order
    beyond S        bits per byte on positions S .. 2S-1, which no training step reached.
                    sinusoidal and rope compute those positions by formula and none has no
                    positions at all, so this measures extrapolation. learned has rows S .. 2S-1
                    in its table, but they never received a gradient (only weight decay):
                    its figure measures untrained rows and is marked as such.

rope and none have the same parameters, hence (same seed) the same initial weights. At
initialisation q·k is tiny and attention nearly uniform, so rotating q and k changes little: the
two only part ways as q and k grow, and on a tiny budget their figures can agree closely.

Results go to `out_dir`: positions.md (a markdown table), positions.json and positions.png
(the bars, and the loss by position with the trained length marked); each run's folder holds
its checkpoint and metrics.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from andrea.cache import shards_dir
from andrea.checkpoint import load_model
from andrea.config import ModelConfig, get_preset
from andrea.errors import AndreaError
from andrea.evaluate import bits_per_byte, token_byte_lengths
from andrea.plots import pyplot, save_figure
from andrea.shards import open_token_data
from andrea.train import train
from andrea.trainconfig import MAX_BATCH, MAX_INT, TrainConfig
from andrea.validate import check_seed

SCHEMES = ("learned", "sinusoidal", "rope", "none")


@dataclass
class PositionsExperiment:
    data_dir: Path
    out_dir: Path
    preset: str = "andrea-tiny"  # the shape; V comes from the data and the context is 2 × seq_len
    steps: int = 200
    seq_len: int = 64
    batch_size: int = 16
    seed: int = 1337
    lr: float = 2e-3
    eval_windows: int = 16  # validation windows of 2 × seq_len tokens per source
    base: ModelConfig | None = None  # a shape to use instead of the preset
    schemes: tuple = field(default=SCHEMES)

    def config(self, vocab_size: int, pos: str) -> ModelConfig:
        base = self.base or get_preset(self.preset)
        return base.replace(vocab_size=vocab_size, block_size=2 * self.seq_len, pos=pos)

    def check(self) -> None:

        for name, high in (("steps", MAX_INT), ("seq_len", 2**20), ("batch_size", MAX_BATCH), ("eval_windows", MAX_BATCH)):
            value, flag = getattr(self, name), name.replace("_", "-")
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AndreaError(f"{flag} must be at least 1, got {str(value)[:40]}.")
            if value > high:
                raise AndreaError(f"{flag} must be at most {high:,}, got {str(value)[:40]}.")
        check_seed(self.seed)
        if not isinstance(self.lr, (int, float)) or isinstance(self.lr, bool) or not 0 < self.lr < math.inf:
            raise AndreaError(f"lr must be a positive finite number, got {self.lr!r}.")
        for s in self.schemes:
            if s not in SCHEMES:
                raise AndreaError(f"unknown position scheme {s!r}; known: {', '.join(SCHEMES)}.")


def default_data_dir() -> Path:
    """The main job's shards when they are cached (andrea.mainjob.cached_main_data), else the
    newest prepared shard folder in the cache."""
    from andrea.mainjob import cached_main_data  # the main job's stages load their modules when they run

    main = cached_main_data()
    if main is not None:
        return main

    root = shards_dir()
    found = sorted(root.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime, reverse=True) if root.is_dir() else []
    if not found:
        raise AndreaError(f"no prepared data in {root}: run `andrea main` once (it prepares and caches the default "
                          f"corpus there), or make a folder with `andrea prepare --tokenizer TOK --out DIR SOURCE...` "
                          f"and pass --data DIR.")
    return found[0].parent


# ---------------------------------------------------------------- measuring one model


@torch.no_grad()
def _nats(model, x: torch.Tensor, y: torch.Tensor, micro_batch: int = 8) -> torch.Tensor:
    """Cross-entropy of every target, (n, T), in nats."""
    out = []
    for i in range(0, len(x), micro_batch):
        logits, _ = model(x[i : i + micro_batch])
        nats = F.cross_entropy(logits.float().flatten(0, 1), y[i : i + micro_batch].flatten(), reduction="none")
        out.append(nats.view(len(logits), -1).double())
    return torch.cat(out)


def eval_windows(data, seq_len: int, windows: int, seed: int) -> dict:
    """The evaluation set: windows of 2S + 1 validation tokens per source, and the same texts'
    first S + 1 tokens shuffled (one fixed permutation per window)."""
    xs, ys = [], []
    for name in data.names:
        x, y = data.val_windows(name, 2 * seq_len, windows)
        xs.append(x), ys.append(y)
    x, y = torch.cat(xs), torch.cat(ys)
    tokens = torch.cat([x[:, :1], y], dim=1)[:, : seq_len + 1]
    gen = torch.Generator().manual_seed(seed)
    shuffled = torch.stack([row[torch.randperm(len(row), generator=gen)] for row in tokens])
    return {"x": x, "y": y, "shuffled_x": shuffled[:, :-1], "shuffled_y": shuffled[:, 1:]}


def measure(model, windows: dict, seq_len: int, byte_len: torch.Tensor) -> dict:
    """Loss and bits per byte within the trained length, beyond it, and on shuffled text."""
    model.eval()
    S = seq_len
    nats = _nats(model, windows["x"], windows["y"])
    nbytes = byte_len[windows["y"]]
    shuf = _nats(model, windows["shuffled_x"], windows["shuffled_y"])
    shuf_bytes = byte_len[windows["shuffled_y"]]

    def bpb(n, b):
        return bits_per_byte(float(n.sum()), float(b.sum()))

    return {
        "val_bpb": bpb(nats[:, :S], nbytes[:, :S]),
        "val_loss": float(nats[:, :S].mean()),
        "shuffled_bpb": bpb(shuf, shuf_bytes),
        "beyond_bpb": bpb(nats[:, S:], nbytes[:, S:]),
        "beyond_loss": float(nats[:, S:].mean()),
        "loss_by_position": nats.mean(dim=0).tolist(),
        "eval_tokens": int(nats[:, :S].numel()),
    }


# ---------------------------------------------------------------- the experiment


def run_positions_experiment(exp: PositionsExperiment, log=print, progress: bool = True) -> dict:

    exp.check()
    data = open_token_data(exp.data_dir)
    tokenizer = data.load_tokenizer()
    V = data.vocab_size
    out = Path(exp.out_dir)
    for scheme in exp.schemes:
        if (out / scheme / "latest.safetensors").exists():
            raise AndreaError(f"{out / scheme} already holds a run; choose another --out or remove that folder.")
    windows = eval_windows(data, exp.seq_len, exp.eval_windows, exp.seed)
    byte_len = token_byte_lengths(tokenizer, V)
    opts_args = dict(recipe="v2", batch_size=exp.batch_size, micro_batch=exp.batch_size, seq_len=exp.seq_len,
                     lr=exp.lr, warmup_steps=max(1, exp.steps // 10), max_steps=exp.steps, eval_every=exp.steps,
                     checkpoint_every=exp.steps, eval_windows=exp.eval_windows, seed=exp.seed, sampling="proportional",
                     audit={"enabled": False})
    rows = []
    for n, scheme in enumerate(exp.schemes, 1):
        cfg = exp.config(V, scheme)
        log(f"[{n}/{len(exp.schemes)}] training pos={scheme}: {exp.steps} steps at length {exp.seq_len}, context {cfg.block_size}")
        t0 = time.time()
        result = train(cfg, TrainConfig(**opts_args), exp.data_dir, out / scheme, log=log, progress=progress)
        seconds = time.time() - t0
        model, _, _ = load_model(result.checkpoint)
        m = measure(model, windows, exp.seq_len, byte_len)
        rows.append({"scheme": scheme, "params": model.num_params(), "seconds": seconds,
                     "checkpoint": str(result.checkpoint), **m})
    shape = exp.config(V, "learned")
    summary = {"settings": {**{k: v for k, v in asdict(exp).items() if k not in ("base", "data_dir", "out_dir")},
                            "data_dir": str(exp.data_dir), "model": shape.to_dict(),
                            "tokens_per_model": exp.steps * exp.batch_size * exp.seq_len,
                            "eval_windows_total": int(len(windows["x"]))},
               "rows": rows}
    md = markdown_table(summary)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "positions.md").write_text(md + "\n")
        (out / "positions.json").write_text(json.dumps(summary, indent=2) + "\n")
    except OSError as e:
        raise AndreaError(f"cannot write the results to {out} ({e.strerror}).") from None
    png = plot_positions(summary, out / "positions.png")
    return {"summary": summary, "markdown": md, "markdown_path": out / "positions.md", "png": png}


def markdown_table(summary: dict) -> str:
    st, rows = summary["settings"], summary["rows"]
    S, m = st["seq_len"], st["model"]
    lines = [
        f"Positions experiment: d_model {m['n_embd']}, {m['n_head']} heads, {m['n_layer']} layers, V {m['vocab_size']:,}, "
        f"context {m['block_size']}; trained at length S = {S} for {st['steps']} steps of {st['batch_size']} sequences "
        f"({st['tokens_per_model']:,} tokens per model), seed {st['seed']}, identical data order; "
        f"evaluated on {st['eval_windows_total']} validation windows of 2S = {2 * S} tokens.",
        "",
        f"| scheme | parameters | val bpb (positions 0–{S - 1}) | shuffled bpb | shuffling costs | "
        f"bpb beyond S (positions {S}–{2 * S - 1}) | beyond − within | train time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        beyond = f"{r['beyond_bpb']:.4f}" + (" †" if r["scheme"] == "learned" else "")
        lines.append(f"| {r['scheme']} | {r['params']:,} | {r['val_bpb']:.4f} | {r['shuffled_bpb']:.4f} | "
                     f"{r['shuffled_bpb'] - r['val_bpb']:+.4f} | {beyond} | {r['beyond_bpb'] - r['val_bpb']:+.4f} | "
                     f"{r['seconds']:.0f} s |")
    lines += [
        "",
        "bpb: bits per byte, lower is better. Shuffled: the same text with each window's tokens in a random order.",
    ]
    if any(r["scheme"] == "learned" for r in rows):
        lines.append(f"† learned: its table has rows {S}–{2 * S - 1} (the context is 2S) but no training step reached "
                     f"them; the figure measures untrained rows, not extrapolation.")
    return "\n".join(lines)


def plot_positions(summary: dict, path) -> Path:

    plt = pyplot()
    rows, S = summary["rows"], summary["settings"]["seq_len"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100)
    names = [r["scheme"] for r in rows]
    x = np.arange(len(rows))
    # bars are coloured by measure (shades), the right panel's lines by scheme (the usual cycle)
    for j, (key, label, color) in enumerate((("val_bpb", f"val (positions < {S})", "0.25"),
                                             ("shuffled_bpb", "shuffled text", "0.6"),
                                             ("beyond_bpb", f"beyond S (positions {S}–{2 * S - 1})", "tab:purple"))):
        values = [r[key] for r in rows]
        bars = ax.bar(x + (j - 1) * 0.27, values, 0.27, label=label, color=color)
        for b, v in zip(bars, values):
            ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [n + (" †" if n == "learned" else "") for n in names])
    ax.set_ylabel("bits per byte (lower is better)")
    ax.set_title("validation, shuffled, beyond the trained length", fontsize=10)
    top = max(max(r[k] for k in ("val_bpb", "shuffled_bpb", "beyond_bpb")) for r in rows)
    ax.set_ylim(0, top * 1.3)
    ax.legend(fontsize=8, loc="upper center", ncol=3), ax.grid(axis="y", alpha=0.3)
    for i, r in enumerate(rows):
        loss = np.array(r["loss_by_position"])
        bins = max(1, len(loss) // 16)
        n = len(loss) // bins * bins
        centres = np.arange(n).reshape(-1, bins).mean(axis=1)
        ax2.plot(centres, loss[:n].reshape(-1, bins).mean(axis=1), marker=".", label=names[i], color=f"C{i}")
    ax2.axvline(S - 0.5, color="k", ls="--", lw=1)
    ax2.text(S - 0.5, ax2.get_ylim()[1], " trained length S", va="top", fontsize=8)
    ax2.set_xlabel("position in the window"), ax2.set_ylabel("cross-entropy (nats/token)")
    ax2.set_title("loss by position (windows of 2S)", fontsize=10)
    ax2.legend(fontsize=8), ax2.grid(alpha=0.3)
    st = summary["settings"]
    fig.suptitle(f"position schemes: {st['steps']} steps at length {S}, same data and seed "
                 f"(† learned rows ≥ S were never trained)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
