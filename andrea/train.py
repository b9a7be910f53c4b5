"""The training loop: one process, or several under `torchrun` (DDP, or FSDP with --fsdp).

One step = one global batch of `batch_size` sequences of `seq_len + 1` tokens, drawn from one
source (the curriculum's pick, or a uniform or token-proportional draw), split over processes and
then into micro-batches of `micro_batch` sequences whose gradients accumulate. Every number the
loop prints is measured: loss, the smoothed (SMMA) loss, tokens/s, MFU, validation loss and bits
per byte per source.

A run folder holds:
  latest.safetensors   the newest checkpoint (every `checkpoint_every` steps, at the end, on
                       SIGTERM or Ctrl-C, and at once on SIGUSR1)
  best.safetensors     the checkpoint with the lowest smoothed loss so far
  metrics.jsonl        one JSON line per step and per evaluation
  loss.png             the loss curves, redrawn at every evaluation
  curriculum.png       pulls, rewards and weights per source over time (with a curriculum)
  train.json           the settings of the run
Resuming restores model, optimizer, step, RNG and data position, curriculum and audit state, so
a resumed run continues exactly as an uninterrupted one would have.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from andrea.checkpoint import check_writable, load_checkpoint, save_checkpoint
from andrea.config import ModelConfig
from andrea.data import TokenData
from andrea.errors import AndreaError
from andrea.flops import flops_per_token, peak_flops
from andrea.model import ANDREA

LOG2 = math.log(2)


@dataclass
class TrainOptions:
    """What a run needs besides the model config. Defaults are the v2 recipe at CPU scale."""

    recipe: str = "v2"  # v1: Adam 3e-4, nothing else; v2: AdamW, clipping, warmup + cosine
    batch_size: int = 16  # sequences per optimizer step (global, over all processes)
    micro_batch: int = 16  # sequences per forward pass per process
    seq_len: int = 256
    lr: float | None = None  # v1 default 3e-4, v2 default 1e-3
    min_lr_ratio: float = 0.1  # v2: cosine decays to lr × this
    weight_decay: float = 0.1  # v2 only, matrices only
    grad_clip: float = 1.0  # v2 only
    warmup_steps: int = 2000  # v2 only
    max_steps: int | None = None
    time_limit: float | None = None  # seconds of training
    eval_every: int = 100
    eval_windows: int = 16  # validation windows per source
    checkpoint_every: int = 100
    seed: int = 1337
    sampling: str = "ucb"  # how a step's source is drawn: ucb, uniform, proportional (by token count)
    sources: list | None = None  # train on these sources of the data only (default: all)
    curriculum: dict = field(default_factory=dict)  # Curriculum keyword arguments (C, floors, caps, ...)
    audit: dict = field(default_factory=lambda: {"enabled": False})  # enabled, every, tokens, threshold, patience
    compile: bool = False
    fsdp: bool = False
    smma_window: int = 100

    def resolved_lr(self) -> float:
        return self.lr if self.lr is not None else (3e-4 if self.recipe == "v1" else 1e-3)

    def check(self) -> None:
        if self.recipe not in ("v1", "v2"):
            raise AndreaError(f"recipe must be v1 or v2, got {self.recipe!r}.")
        if self.sampling not in ("ucb", "uniform", "proportional"):
            raise AndreaError(f"sampling must be ucb, uniform or proportional, got {self.sampling!r}.")
        for name in ("batch_size", "micro_batch", "seq_len", "eval_every", "checkpoint_every", "eval_windows"):
            if getattr(self, name) < 1:
                raise AndreaError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.max_steps is None and self.time_limit is None:
            raise AndreaError("give --max-steps or --time-limit (or both) so the run knows when to stop.")
        if self.max_steps is not None and self.max_steps < 1:
            raise AndreaError(f"max_steps must be at least 1, got {self.max_steps}.")
        if self.time_limit is not None and self.time_limit <= 0:
            raise AndreaError(f"time_limit must be positive, got {self.time_limit}.")


# ---------------------------------------------------------------- pieces of the loop


class SMMA:
    """Smoothed moving average: s ← s + (x − s)/n with n growing to `window` (Wilder's SMMA)."""

    def __init__(self, window: int = 100):
        self.window, self.n, self.value = window, 0, float("nan")

    def update(self, x: float) -> float:
        self.n = min(self.n + 1, self.window)
        self.value = x if self.n == 1 else self.value + (x - self.value) / self.n
        return self.value

    def state_dict(self) -> dict:
        return {"window": self.window, "n": self.n, "value": self.value}

    def load_state_dict(self, d: dict) -> None:
        self.window, self.n, self.value = d["window"], d["n"], d["value"]


def make_optimizer(model: torch.nn.Module, opts: TrainOptions, device: torch.device) -> torch.optim.Optimizer:
    lr = opts.resolved_lr()
    fused = device.type in ("cuda", "cpu")  # one kernel for all parameters: ~3x faster steps on CPU too
    if opts.recipe == "v1":
        return torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.999), fused=fused or None)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": opts.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused or None)


def lr_at(opts: TrainOptions, step: int, progress: float) -> float:
    """v1: constant. v2: linear warmup over warmup_steps, then cosine to min_lr_ratio × lr.

    `progress` is the fraction of the run done: step / max_steps, or elapsed / time_limit when
    only a time limit is given.
    """
    lr = opts.resolved_lr()
    if opts.recipe == "v1":
        return lr
    if step < opts.warmup_steps:
        return lr * (step + 1) / opts.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, max(0.0, progress))))
    return lr * (opts.min_lr_ratio + (1 - opts.min_lr_ratio) * cos)


def token_byte_lengths(tokenizer, vocab_size: int) -> torch.Tensor:
    return torch.tensor([len(tokenizer.token_bytes(i)) for i in range(vocab_size)], dtype=torch.float64)


@torch.no_grad()
def evaluate(model, data: TokenData, seq_len: int, windows: int, micro_batch: int, byte_len: torch.Tensor,
             device, autocast) -> dict:
    """Validation loss (nats/token) and bits per byte, per source and over all of them."""
    model.eval()
    out, total_nats, total_bytes, total_tokens = {}, 0.0, 0.0, 0
    for name in data.names:
        x, y = data.val_windows(name, seq_len, windows)
        nats = 0.0
        for i in range(0, len(x), micro_batch):
            xb, yb = x[i : i + micro_batch].to(device), y[i : i + micro_batch].to(device)
            with autocast:
                logits, _ = model(xb)
            nats += torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), yb.flatten(), reduction="sum").item()
        nbytes = byte_len[y.flatten()].sum().item()
        out[name] = {"loss": nats / y.numel(), "bpb": nats / (LOG2 * max(nbytes, 1)), "tokens": y.numel()}
        total_nats, total_bytes, total_tokens = total_nats + nats, total_bytes + nbytes, total_tokens + y.numel()
    out["all"] = {"loss": total_nats / total_tokens, "bpb": total_nats / (LOG2 * max(total_bytes, 1)), "tokens": total_tokens}
    model.train()
    return out


def plot_losses(metrics_path: Path, png_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, loss, smma, ev_steps, ev = [], [], [], [], {}
    with open(metrics_path) as f:
        for line in f:
            row = json.loads(line)
            if "loss" in row and "eval" not in row:
                steps.append(row["step"]), loss.append(row["loss"]), smma.append(row["smma"])
            elif "eval" in row:
                ev_steps.append(row["step"])
                for name, m in row["eval"].items():
                    ev.setdefault(name, []).append(m["loss"])
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(steps, loss, color="0.75", lw=0.8, label="train loss")
    ax.plot(steps, smma, color="C0", lw=1.5, label="smoothed (SMMA)")
    for i, (name, values) in enumerate(ev.items()):
        ax.plot(ev_steps[: len(values)], values, marker="o", ms=3, lw=1.2 if name != "all" else 2,
                color="k" if name == "all" else f"C{i + 1}", label=f"val {name}")
    ax.set_xlabel("step"), ax.set_ylabel("cross-entropy (nats/token)"), ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("andrea training")
    fig.tight_layout()
    tmp = png_path.with_name(png_path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, png_path)


class Signals:
    """SIGTERM and Ctrl-C ask for a checkpoint and a clean stop; SIGUSR1 for a checkpoint now."""

    def __init__(self):
        self.stop = self.save_now = False
        self.previous = {}

    def install(self) -> None:
        def on_stop(signum, frame):
            self.stop = True

        def on_usr1(signum, frame):
            self.save_now = True

        for sig, handler in ((signal.SIGTERM, on_stop), (signal.SIGINT, on_stop), (signal.SIGUSR1, on_usr1)):
            self.previous[sig] = signal.signal(sig, handler)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------- the run


@dataclass
class RunResult:
    step: int
    stopped: str  # "max_steps", "time_limit", "signal", "audit"
    eval: dict | None
    checkpoint: Path | None
    tokens_per_s: float
    mfu: float | None
    elapsed: float


def _dist_setup():
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _pick_device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def train(model_cfg: ModelConfig, opts: TrainOptions, data_dir, out_dir, resume: bool = False,
          log=print, progress: bool = True, on_step=None) -> RunResult:
    """Train until max_steps, time_limit, a signal, a halting audit, or `on_step(step, loss)`
    returning True (then it stops as on a signal: checkpoint, no final evaluation)."""
    opts.check()
    rank, world = _dist_setup()
    master = rank == 0
    device = _pick_device()
    out = Path(out_dir)

    # ---- everything a user can get wrong is checked before any work is done
    data = TokenData(data_dir)
    tokenizer = data.load_tokenizer()
    if tokenizer.vocab_size != model_cfg.vocab_size:
        raise AndreaError(f"the data's tokenizer has V = {tokenizer.vocab_size:,} but the model has V = {model_cfg.vocab_size:,}; "
                          f"prepare the data with a tokenizer of {model_cfg.n_segments:,} segments or pick a matching model.")
    if opts.seq_len > model_cfg.block_size:
        raise AndreaError(f"seq_len {opts.seq_len} is longer than the model's context {model_cfg.block_size}.")
    data.check_context(opts.seq_len)
    if opts.batch_size % world:
        raise AndreaError(f"batch_size {opts.batch_size} does not split over {world} processes.")
    per_rank = opts.batch_size // world
    micro = min(opts.micro_batch, per_rank)
    if per_rank % micro:
        raise AndreaError(f"the per-process batch {per_rank} is not a multiple of micro_batch {micro}.")
    accum = per_rank // micro
    if master:
        check_writable(out, "the run folder")
    latest = out / "latest.safetensors"
    ckpt = None
    if resume:
        if not latest.exists():
            raise AndreaError(f"there is no checkpoint to resume from in {out}.")
        ckpt = load_checkpoint(latest)
        if ckpt.config != model_cfg:
            raise AndreaError(f"{latest} was trained with another model config ({ckpt.config.to_dict()}); "
                              f"resume with the same preset or config.")
        saved = ckpt.meta.get("train", {})
        for key in ("batch_size", "seq_len", "recipe", "sampling", "seed"):
            if key in saved and saved[key] != getattr(opts, key):
                raise AndreaError(f"{latest} was trained with {key} = {saved[key]!r}, not {getattr(opts, key)!r}; "
                                  f"resume with the same settings.")
        if ckpt.meta.get("data_fingerprint") not in (None, data.manifest["tokenizer"]):
            raise AndreaError(f"{latest} was trained on data made with another tokenizer than {data.dir}.")
    elif master and latest.exists():
        raise AndreaError(f"{out} already holds a run; pass --resume to continue it or choose another --out.")

    # ---- model, optimizer, data order, curriculum, audit
    torch.manual_seed(opts.seed)
    model = ANDREA(model_cfg).to(device)
    if ckpt is not None:
        model.load_state_dict(ckpt.model_state)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        model.vocab_multiple = 64
    train_model = model
    if world > 1:
        if opts.fsdp:
            from torch.distributed.fsdp import fully_shard

            # FSDP2: each block's parameters, then the rest, are sharded over the processes
            for block in model.h:
                fully_shard(block)
            fully_shard(model)
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP

            train_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = make_optimizer(train_model, opts, device)
    if ckpt is not None and ckpt.optim_state is not None:
        _load_optimizer_state(optimizer, ckpt.optim_state, train_model, opts.fsdp and world > 1)
    forward = torch.compile(train_model) if opts.compile else train_model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()

    data_rng = np.random.default_rng(opts.seed)
    names = data.names
    if opts.sources:
        missing = [n for n in opts.sources if n not in names]
        if missing:
            raise AndreaError(f"source(s) {', '.join(missing)} are not in {data.dir}; it holds {', '.join(names)}.")
        names = list(opts.sources)
    share = {n: w for n, w in data.token_share().items() if n in names}
    curriculum = _make_curriculum(opts, names)
    auditor = _make_auditor(opts, data, tokenizer)
    smma = SMMA(opts.smma_window)
    step, tokens_seen, best_smma, elapsed_before = 0, 0, float("inf"), 0.0
    if ckpt is not None:
        step = ckpt.step
        tokens_seen = ckpt.meta.get("tokens_seen", 0)
        best_smma = ckpt.meta.get("best_smma", float("inf"))
        elapsed_before = ckpt.meta.get("elapsed", 0.0)
        if "data_rng" in ckpt.meta:  # absent in checkpoints converted from other formats: data order restarts
            data_rng.bit_generator.state = ckpt.meta["data_rng"]
        if "smma" in ckpt.meta:
            smma.load_state_dict(ckpt.meta["smma"])
        if curriculum is not None and "curriculum" in ckpt.meta:
            curriculum.load_state_dict(ckpt.meta["curriculum"])
        if auditor is not None and "audit" in ckpt.meta:
            auditor.load_state_dict(ckpt.meta["audit"])
        if "rng_torch" in ckpt.meta:
            torch.set_rng_state(ckpt.meta["rng_torch"])

    byte_len = token_byte_lengths(tokenizer, model_cfg.vocab_size)
    fpt = flops_per_token(model_cfg, opts.seq_len)
    peak = peak_flops(device) if master else None
    tokens_per_step = opts.batch_size * opts.seq_len
    metrics_path = out / "metrics.jsonl"
    if master:
        (out / "train.json").write_text(json.dumps({"model": model_cfg.to_dict(), "train": asdict(opts),
                                                    "data": str(Path(data_dir).resolve()), "world_size": world}, indent=2) + "\n")
        log(f"model: {sum(p.numel() for p in model.parameters()):,} parameters on {device}"
            f"{f' × {world} processes' if world > 1 else ''}; {tokens_per_step:,} tokens per step "
            f"({opts.batch_size} × {opts.seq_len}, {accum} micro-batch{'es' if accum > 1 else ''} of {micro} per process)")
        if ckpt is not None:
            log(f"resuming {out} at step {step:,}")

    def save(path_name: str = "latest.safetensors", extra: dict | None = None) -> Path | None:
        model_state = _full_state(train_model, model, opts.fsdp and world > 1)
        optim_state = _full_optim_state(optimizer, train_model, opts.fsdp and world > 1)
        if not master:
            return None
        meta = {"step": step, "tokens_seen": tokens_seen, "best_smma": best_smma, "smma": smma.state_dict(),
                "elapsed": elapsed_before + (time.time() - t_start), "data_rng": data_rng.bit_generator.state,
                "train": asdict(opts), "tokenizer": tokenizer.to_dict(), "data_fingerprint": data.manifest["tokenizer"],
                **(extra or {})}
        if curriculum is not None:
            meta["curriculum"] = curriculum.state_dict()
        if auditor is not None:
            meta["audit"] = auditor.state_dict()
        return save_checkpoint(out / path_name, model_cfg, model_state, optim_state, meta)

    signals = Signals()
    if master or world == 1:
        signals.install()
    bar = None
    if master and progress:
        from tqdm import tqdm

        bar = tqdm(total=opts.max_steps, initial=step, unit="step", dynamic_ncols=True, leave=True)
    t_start = time.time()
    window_t, window_tokens = time.time(), 0
    tok_s, mfu, last_eval, stopped = 0.0, None, None, None
    train_model.train()
    try:
        while True:
            elapsed = elapsed_before + (time.time() - t_start)
            if opts.max_steps is not None and step >= opts.max_steps:
                stopped = "max_steps"
                break
            if opts.time_limit is not None and elapsed >= opts.time_limit:
                stopped = "time_limit"
                break
            if _any_rank(signals.stop, world, device):
                stopped = "signal"
                break
            progress_frac = step / opts.max_steps if opts.max_steps else elapsed / opts.time_limit
            lr = lr_at(opts, step, progress_frac)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # the global batch: one source, offsets from the shared generator, this rank's slice
            source = _pick_source(curriculum, opts.sampling, names, share, data_rng, step)
            offsets = data.sample_offsets(source, opts.batch_size, opts.seq_len, data_rng)
            mine = offsets[rank * per_rank : (rank + 1) * per_rank]
            loss_sum = torch.zeros((), device=device)
            for m in range(accum):
                x, y = data.windows(source, mine[m * micro : (m + 1) * micro], opts.seq_len)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                last = m == accum - 1
                if opts.fsdp and world > 1:
                    model.set_requires_gradient_sync(last)
                    sync = nullcontext()
                else:
                    sync = nullcontext() if (last or world == 1) else train_model.no_sync()
                with sync, autocast:
                    _, loss = forward(x, y)
                (loss / accum).backward()
                loss_sum += loss.detach()
            loss_t = loss_sum / accum
            if world > 1:
                dist.all_reduce(loss_t, op=dist.ReduceOp.AVG)
            loss_value = loss_t.item()
            if not math.isfinite(loss_value):
                where = f"; the last good checkpoint is {latest}" if latest.exists() else "; no checkpoint was written yet"
                raise AndreaError(f"the loss became {loss_value} at step {step + 1} ({source}); training stopped{where}.")
            if opts.recipe == "v2" and opts.grad_clip > 0:
                grad_norm = _clip(train_model, opts.grad_clip, opts.fsdp and world > 1)
            else:
                grad_norm = None
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            tokens_seen += tokens_per_step
            window_tokens += tokens_per_step
            smoothed = smma.update(loss_value)
            if curriculum is not None:
                curriculum.update(source, loss_value)
            if on_step is not None and on_step(step, loss_value):
                signals.stop = True

            now = time.time()
            if now - window_t >= 2.0 or step == 1:
                tok_s = window_tokens / (now - window_t)
                mfu = tok_s * fpt / peak if peak else None
                window_t, window_tokens = now, 0
            if master:
                row = {"step": step, "loss": loss_value, "smma": smoothed, "lr": lr, "source": source,
                       "tokens": tokens_seen, "tok_per_s": tok_s, "mfu": mfu, "time": round(elapsed, 3)}
                if grad_norm is not None:
                    row["grad_norm"] = grad_norm
                if curriculum is not None:
                    row["weights"] = curriculum.weights
                _append(metrics_path, row)
                if bar is not None:
                    post = {"loss": f"{loss_value:.3f}", "smma": f"{smoothed:.3f}", "tok/s": f"{tok_s:,.0f}"}
                    if mfu is not None:
                        post["mfu"] = f"{100 * mfu:.1f}%"
                    if opts.time_limit:
                        post["left"] = _fmt_time(max(0.0, opts.time_limit - elapsed))
                    if curriculum is not None:
                        post["w"] = " ".join(f"{n[:4]}={w:.2f}" for n, w in curriculum.weights.items())
                    bar.set_postfix(post, refresh=False)
                    bar.update(1)

            pause = time.time()  # evaluation, audit and checkpoints do not count against tokens/s
            if step % opts.eval_every == 0:
                last_eval = _eval_and_log(model, data, opts, byte_len, device, autocast, master, step, metrics_path, out, log, bar, world)
                if master and curriculum is not None:
                    _plot_curriculum(curriculum, out / "curriculum.png")
            if auditor is not None and step % auditor.every == 0:
                halt = _audit(model, tokenizer, auditor, device, master, step, metrics_path, log, bar, world, opts.fsdp and world > 1)
                if halt:
                    stopped = "audit"
                    break
            want_save = step % opts.checkpoint_every == 0 or _any_rank(signals.save_now, world, device)
            if want_save:
                signals.save_now = False
                save()
                if smoothed < best_smma:
                    best_smma = smoothed
                    save("best.safetensors")
            window_t += time.time() - pause
    finally:
        if bar is not None:
            bar.close()
        signals.restore()

    elapsed = elapsed_before + (time.time() - t_start)
    if stopped != "signal":
        if last_eval is None or last_eval[0] != step:
            last_eval = _eval_and_log(model, data, opts, byte_len, device, autocast, master, step, metrics_path, out, log, None, world)
    path = save()
    if master and curriculum is not None:
        _plot_curriculum(curriculum, out / "curriculum.png")
    if smma.value < best_smma:  # every process takes part: under FSDP saving is collective
        best_smma = smma.value
        save("best.safetensors")
    if master and stopped == "signal":
        log(f"stopped by a signal at step {step:,}; checkpoint {path} (resume with --resume)")
    if master and stopped == "audit":
        log(f"the sample audit halted training at step {step:,}: {auditor.patience} scores in a row below "
            f"{auditor.threshold}; checkpoint {path}")
    return RunResult(step=step, stopped=stopped, eval=last_eval[1] if last_eval else None, checkpoint=path,
                     tokens_per_s=tok_s, mfu=mfu, elapsed=elapsed)


# ---------------------------------------------------------------- helpers of the loop


def _fmt_time(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _append(path: Path, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def _any_rank(flag: bool, world: int, device) -> bool:
    if world == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _pick_source(curriculum, sampling: str, names: list[str], share: dict, rng: np.random.Generator, step: int) -> str:
    if len(names) == 1:
        return names[0]
    if curriculum is not None:
        return curriculum.next_source(step)
    p = np.array([share[n] for n in names])
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def _make_curriculum(opts: TrainOptions, names: list[str]):
    if opts.sampling == "proportional" or len(names) == 1:
        return None
    from andrea.curriculum import Curriculum

    kwargs = dict(opts.curriculum)
    kwargs.setdefault("seed", opts.seed)
    return Curriculum(names, mode=opts.sampling, **kwargs)


def _plot_curriculum(curriculum, path: Path) -> None:
    from andrea.curriculum import plot_curriculum

    if curriculum.history:
        plot_curriculum(curriculum.history, path)


def _make_auditor(opts: TrainOptions, data: TokenData, tokenizer):
    if not opts.audit.get("enabled", False):
        return None
    from andrea.audit import AuditTracker, build_lexicon

    tracker = AuditTracker(threshold=opts.audit.get("threshold", 30), patience=opts.audit.get("patience", 5))
    tracker.every = int(opts.audit.get("every", 100))
    tracker.tokens = int(opts.audit.get("tokens", 420))
    # "real words" are the words of the training text (its first 200k tokens per source)
    tracker.lexicon = build_lexicon(tokenizer.decode([int(t) for t in s.train[:200_000] if t != tokenizer.BOS])
                                    for s in data.sources.values())
    return tracker


def _eval_and_log(model, data, opts, byte_len, device, autocast, master, step, metrics_path, out, log, bar, world):
    if world > 1:
        dist.barrier()
    result = None
    if master or opts.fsdp:  # a sharded model needs every process for a forward pass
        result = evaluate(model, data, opts.seq_len, opts.eval_windows, opts.micro_batch, byte_len, device, autocast)
    if master:
        _append(metrics_path, {"step": step, "eval": result})
        parts = "  ".join(f"{n} {m['bpb']:.3f}" for n, m in result.items() if n != "all")
        msg = f"step {step:,}: val loss {result['all']['loss']:.4f}, {result['all']['bpb']:.4f} bits/byte  ({parts})"
        (bar.write if bar is not None else log)(msg)
        try:
            plot_losses(metrics_path, out / "loss.png")
        except (ValueError, OSError) as e:
            (bar.write if bar is not None else log)(f"note: could not draw loss.png ({e})")
    if world > 1:
        dist.barrier()
    return (step, result)


def _audit(model, tokenizer, auditor, device, master, step, metrics_path, log, bar, world, fsdp) -> bool:
    halt = False
    if master or fsdp:  # under FSDP every process generates the same sample (same seed, same logits)
        from andrea.generate import generate_ids

        model.eval()
        ids = generate_ids(model, [tokenizer.BOS], max_new_tokens=auditor.tokens, temperature=1.0, top_k=50,
                           seed=step, stop_at_bos=False)
        model.train()
    if master:
        from andrea.audit import coherence_score

        text = tokenizer.decode([i for i in ids if i != tokenizer.BOS])
        score, parts = coherence_score(text, auditor.lexicon)
        halt = auditor.add(score)
        _append(metrics_path, {"step": step, "audit": {"score": score, "components": parts, "text": text}})
        (bar.write if bar is not None else log)(f"step {step:,}: sample audit {score:.0f}/100")
    if world > 1:
        t = torch.tensor([1.0 if halt else 0.0], device=device)
        dist.broadcast(t, 0)
        halt = bool(t.item())
    return halt


def _clip(train_model, max_norm: float, fsdp: bool) -> float:
    norm = torch.nn.utils.clip_grad_norm_(train_model.parameters(), max_norm)
    if fsdp:
        norm = norm.full_tensor()
    return float(norm)



def _full_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)


def _param_names_in_optimizer_order(optimizer, model) -> list[str]:
    """Names of the parameters in the order a plain optimizer numbers them (group by group)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _full_state(train_model, model, fsdp: bool) -> dict:
    if not fsdp:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options())


def _full_optim_state(optimizer, train_model, fsdp: bool) -> dict:
    """The optimizer state as a plain single-process optimizer has it: keyed by index."""
    if not fsdp:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = get_optimizer_state_dict(train_model, optimizer, options=_full_options())
    if not full:  # only rank 0 receives the gathered state
        return {}
    index = {n: i for i, n in enumerate(_param_names_in_optimizer_order(optimizer, train_model))}
    return {"state": {index[n]: v for n, v in full["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]}


def _load_optimizer_state(optimizer, state: dict, train_model, fsdp: bool) -> None:
    if not fsdp:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = _param_names_in_optimizer_order(optimizer, train_model)
    keyed = {"state": {names[int(i)]: v for i, v in state["state"].items()},
             "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(train_model, optimizer, keyed, options=_full_options())
