"""The training loop: one process, or several under `torchrun` (DDP, or FSDP with --fsdp).

One step = one global batch of `batch_size` sequences of `seq_len + 1` tokens, drawn from one
source (the curriculum's pick, or a uniform or token-proportional draw), split over processes and
then into micro-batches of `micro_batch` sequences whose gradients accumulate. Every number the
loop prints is measured: loss, the smoothed (SMMA) loss, tokens/s, MFU, validation loss and bits
per byte per source.

The file reads top down: `train` is the loop; `Run` holds the parts it drives (settings, data,
model, optimizer) and does one step, one evaluation, one audit, one checkpoint each. Beside it:
andrea.runstate (everything that changes from step to step besides weights and optimizer: what a
checkpoint saves and `--resume` restores), andrea.distributed (processes, DDP and FSDP),
andrea.evaluate (bits per byte), andrea.metrics (metrics.jsonl), andrea.snapshots.observers (the
embedding observers) and andrea.plots (loss.png, curriculum.png).

A run folder holds:
  latest.safetensors   the newest checkpoint (every `checkpoint_every` steps, at the end, on
                       SIGTERM or Ctrl-C, and at once on SIGUSR1)
  best.safetensors     the checkpoint with the lowest validation loss (over every source) at an
                       evaluation so far, written at that evaluation
  metrics.jsonl        one JSON line per step, per evaluation and per audit
  loss.png             the loss curves, redrawn at every evaluation
  curriculum.png       pulls, rewards and weights per source over time (with a curriculum)
  embeddings/          snapshots of the embedding tables at steps 0, 1, 2, 4, … and at every
                       evaluation (`andrea.snapshots.store`); with the word-similarity sets fetched, every
                       evaluation also writes their scores to metrics.jsonl (`andrea.inside.wordsim`)
  train.json           the settings of the run
  .lock                held by the running process: a second run in the same folder is refused
A write killed by SIGKILL leaves its temporary file (NAME.tmp-PID-HEX); the next run, holding the
lock, removes those whose process is gone. Signals are handled from start-up until the last
checkpoint is on disk (andrea.signals), and every shard is checked against the manifest before
the first step (andrea.shards.verify_shards).
Resuming restores model, optimizer, step, RNG and data position, curriculum and audit state, so
a resumed run continues exactly as an uninterrupted one would have.

What is saved is checked first. After every optimizer step the weights must be finite; before
every checkpoint the weights and Adam's moments must be finite and the model's loss on a
validation window too. A state that fails is never written: the previous latest.safetensors
stays, and the error names it (with its step) as the last good checkpoint. A resumed checkpoint
is checked the same way, and its optimizer state against the model (every parameter's moments
present, of its shape, finite), before the first step.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from andrea.audit import coherence_score, make_auditor
from andrea.checkpoint import save_checkpoint
from andrea.config import BOS, ModelConfig
from andrea.curriculum import make_curriculum, pick_source
from andrea.decoding.generate import generate_ids
from andrea.distributed import (
    all_finite,
    any_rank,
    clip_gradients,
    full_state,
    grad_sync,
    local_part,
    pick_device,
    setup_processes,
    wrap_model,
)
from andrea.errors import AndreaError
from andrea.evaluate import evaluate, token_byte_lengths
from andrea.files import (
    FolderLock,
    atomic_write_bytes,
    check_writable,
    remove_dead_temps,
)
from andrea.flops import flops_per_token, peak_flops
from andrea.memory import check_training_memory
from andrea.metrics import Meter, append_row
from andrea.model import ANDREA
from andrea.optim import lr_at, make_optimizer
from andrea.optim_state import full_optim_state, load_optimizer_state
from andrea.plots import plot_curriculum, plot_losses
from andrea.processor import bf16_verdict, processor_line, training_autocast
from andrea.runstate import RunState, checkpoint_to_resume
from andrea.shards import TokenData, check_validation, open_token_data
from andrea.signals import Signals, is_main_process
from andrea.snapshots.observers import make_growth, record_heads, score_similarity
from andrea.trainconfig import TrainConfig, batch_split


@dataclass
class RunResult:
    step: int
    stopped: str  # "max_steps", "time_limit", "signal", "audit", "patience"
    eval: dict | None
    checkpoint: Path | None
    tokens_per_s: float
    mfu: float | None
    elapsed: float


# ---------------------------------------------------------------- the loop


def train(model_cfg: ModelConfig, cfg: TrainConfig, data_dir=None, out_dir=None, resume: bool = False,
          log=print, progress: bool = True, on_step=None, signals: Signals | None = None) -> RunResult:
    """Train until max_steps, time_limit, `patience` evaluations without a lower validation loss, a
    signal, a halting audit, or `on_step(step, loss)` returning True (then it stops as on a signal:
    checkpoint, no final evaluation). `data_dir` and `out_dir` default to the config's `data` and
    `out`. The signal handlers (andrea.signals) are those of `signals` when the caller installed
    them earlier (the command line does, before it imports torch), else installed here; either way
    they stay until the last checkpoint is on disk."""
    with Signals(install=is_main_process()) if signals is None else nullcontext(signals) as signals:
        run = Run(model_cfg, cfg, data_dir or cfg.data, out_dir or cfg.out, resume, log)
        try:
            result = _train(run, progress, on_step, signals)
            run.leave_together()
            return result
        finally:
            run.close()


def _train(run: "Run", progress: bool, on_step, signals: Signals) -> RunResult:
    log, state, cfg = run.log, run.state, run.cfg
    meter = Meter(run.tokens_per_step, run.flops_per_token, run.peak)
    bar = run.progress_bar() if progress and run.master else None
    say = log if bar is None else functools.partial(_write_beside, bar, log)
    last_eval, stopped = None, None
    run.observe(evaluation=False)  # the snapshot of step 0: the tables as initialised
    signals.running()
    try:
        while (stopped := run.reason_to_stop(signals.stop)) is None:
            source, loss, lr, grad_norm = run.step()
            if on_step is not None and on_step(state.step, loss):
                signals.stop = True
            meter.count(state.step)
            run.record_step(source, loss, lr, grad_norm, meter, bar)
            with meter.paused():  # evaluation, audits and checkpoints do not count against tokens/s
                run.observe(evaluation=False)
                if state.step % cfg.eval_every == 0:
                    last_eval = run.evaluate(say)
                    if cfg.patience and state.evals_since_best >= cfg.patience:
                        stopped = "patience"  # validation stopped improving: no more epochs of the same text
                        break
                if state.auditor is not None and state.step % cfg.audit["every"] == 0 and run.audit(say):
                    stopped = "audit"
                    break
                if state.step % cfg.checkpoint_every == 0 or run.any_rank(signals.take_save_request()):
                    run.checkpoint()
    finally:
        if bar is not None:
            bar.close()
    if stopped != "signal" and (last_eval is None or last_eval[0] != state.step):
        last_eval = run.evaluate(log)
    path = run.checkpoint(final=True)
    run.say_why(stopped, path)
    return RunResult(step=state.step, stopped=stopped, eval=last_eval[1] if last_eval else None, checkpoint=path,
                     tokens_per_s=meter.tokens_per_s, mfu=meter.mfu, elapsed=run.elapsed())


# ---------------------------------------------------------------- the run's state


# ---------------------------------------------------------------- the run's parts


class Run:
    """Settings, data, model, optimizer and state of one run, and the operations of the loop."""

    def __init__(self, model_cfg: ModelConfig, cfg: TrainConfig, data_dir, out_dir, resume: bool, log):
        if not data_dir or not out_dir:
            raise AndreaError("training needs a data folder (made by `andrea prepare`) and a run folder.")
        self.cfg = cfg = cfg.for_model(model_cfg.block_size)
        self.model_cfg, self.log, self.out = model_cfg, log, Path(out_dir)
        self.made_group = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized()
        self.rank, self.world = setup_processes()
        self.master = self.rank == 0
        self.device = pick_device()
        self.fsdp = cfg.fsdp and self.world > 1

        # ---- everything a user can get wrong is checked before any work is done
        self.data = data = open_token_data(data_dir, log=log if self.master else None, save=self.master)
        self.tokenizer = data.load_tokenizer()
        if self.tokenizer.vocab_size != model_cfg.vocab_size:
            raise AndreaError(f"the data's tokenizer has V = {self.tokenizer.vocab_size:,} but the model has "
                              f"V = {model_cfg.vocab_size:,}; prepare the data with a tokenizer of "
                              f"{model_cfg.n_segments:,} segments or pick a matching model.")
        data.check_context(cfg.seq_len)
        self.names = self._source_names()
        check_validation(data, self.names, cfg.seq_len)
        self.per_rank, self.micro, self.accum = batch_split(cfg, self.world)
        check_training_memory(model_cfg, cfg.seq_len, self.micro, self.device)
        self.lock = None
        if self.master:
            check_writable(self.out, "the run folder")
            self.lock = FolderLock(self.out, "the run folder", "; wait for it to end or choose another --out")
        try:
            for stale in remove_dead_temps(self.out) if self.master else ():  # left by a killed write (SIGKILL)
                log(f"removed {stale.name}, the temporary file of a write whose process is gone")
            self._setup(model_cfg, cfg, data, data_dir, resume)
        except BaseException:
            self.close()
            raise

    def _setup(self, model_cfg: ModelConfig, cfg: TrainConfig, data: TokenData, data_dir, resume: bool) -> None:
        ckpt = checkpoint_to_resume(self.out, self.model_cfg, self.cfg, self.data) if resume else None
        if not resume and self.master and (self.out / "latest.safetensors").exists():
            raise AndreaError(f"{self.out} already holds a run; pass --resume to continue it or choose another --out.")
        # the last checkpoint known to be good: the one resumed from, then each one this run writes
        self.last_good = (self.out / "latest.safetensors", ckpt.step) if ckpt is not None else None

        # ---- model, optimizer, state
        torch.manual_seed(cfg.seed)
        self.model = ANDREA(model_cfg).to(self.device)
        if ckpt is not None:
            self.model.load_state_dict(ckpt.model_state)
        self.train_model = wrap_model(self.model, self.device, self.world, self.fsdp)
        self.optimizer = make_optimizer(self.train_model, cfg.recipe, cfg.resolved_lr(), cfg.weight_decay, self.device,
                                        muon_lr=cfg.muon_lr)
        if ckpt is not None and ckpt.optim_state is not None and ckpt.optim_state["state"]:
            load_optimizer_state(self.optimizer, ckpt.optim_state, self.train_model, cfg.recipe, self.fsdp,
                                  self.out / "latest.safetensors")
        self.forward = torch.compile(self.train_model) if cfg.compile else self.train_model
        self.autocast = training_autocast(self.device)  # bf16 on CUDA and where a CPU computes it natively
        self.share = {n: w for n, w in data.token_share().items() if n in self.names}
        self.state = RunState(cfg, make_curriculum(cfg, self.names), make_auditor(cfg, data, self.tokenizer))
        if ckpt is not None:
            self.state.load_state_dict(ckpt.meta, self.out / "latest.safetensors")
        self.growth, self.scorer = self._make_growth(ckpt)
        self.t_start = time.time()
        self.probe = tuple(t[:1] for t in data.val_windows(self.names[0], cfg.seq_len, 1))  # tests a state before it is saved
        self.proven_step = None  # the step whose state was last proven sound (best and latest share a proof)
        self.plotted_step = None  # the step curriculum.png was last drawn at

        # ---- what the loop measures
        self.byte_len = token_byte_lengths(self.tokenizer, model_cfg.vocab_size)
        self.flops_per_token = flops_per_token(model_cfg, cfg.seq_len)
        self.peak = peak_flops(self.device) if self.master else None
        self.tokens_per_step = cfg.batch_size * cfg.seq_len
        self.metrics_path = self.out / "metrics.jsonl"
        if self.master:
            self._describe(data_dir, resumed=ckpt is not None)
        self.train_model.train()

    # ---- the step

    def reason_to_stop(self, signalled: bool) -> str | None:
        cfg, elapsed = self.cfg, self.elapsed()
        if cfg.max_steps is not None and self.state.step >= cfg.max_steps:
            return "max_steps"
        if cfg.time_limit is not None and elapsed >= cfg.time_limit:
            return "time_limit"
        if self.any_rank(signalled):
            return "signal"
        return None

    def step(self) -> tuple[str, float, float, float | None]:
        """One optimizer step on one source: (source, loss, learning rate, gradient norm)."""
        cfg, state = self.cfg, self.state
        lr = lr_at(cfg.recipe, cfg.resolved_lr(), state.step, self.progress(), cfg.warmup_steps, cfg.min_lr_ratio,
                   cfg.decay_fraction)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        # the global batch: one source, offsets from the shared generator, this rank's slice
        source = pick_source(state.curriculum, self.names, self.share, state.data_rng, state.step)
        offsets = self.data.sample_offsets(source, cfg.batch_size, cfg.seq_len, state.data_rng)
        mine = offsets[self.rank * self.per_rank : (self.rank + 1) * self.per_rank]
        loss_sum = torch.zeros((), device=self.device)
        batches = []
        for m in range(self.accum):
            x, y = self.data.windows(source, mine[m * self.micro : (m + 1) * self.micro], cfg.seq_len)
            batches.append(x)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self._grad_sync(last=m == self.accum - 1), self.autocast:
                _, loss = self.forward(x, y)
            (loss / self.accum).backward()
            loss_sum += loss.detach()
        if self.growth is not None:
            self.growth.count(batches)  # once per step: a token counts once however many micro-batches held it
        clip = cfg.recipe != "v1" and cfg.grad_clip > 0
        grad_norm = clip_gradients(self.train_model, cfg.grad_clip, self.fsdp) if clip else None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss, grad_norm, weights_finite = self._read_step(loss_sum / self.accum, grad_norm)
        if not math.isfinite(loss):
            self.stop_on_bad_state(f"the loss became {loss} at step {state.step + 1} ({source})")
        if not weights_finite:
            self.stop_on_bad_state(f"the update of step {state.step + 1} ({source}, learning rate {lr:g}) made the "
                                   f"weights NaN or infinite")
        state.step += 1
        state.tokens_seen += self.tokens_per_step
        state.smma.update(loss)
        if state.curriculum is not None:
            state.curriculum.update(source, loss)
        return source, loss, lr, grad_norm

    # ---- what happens between steps

    def record_step(self, source: str, loss: float, lr: float, grad_norm, meter: "Meter", bar) -> None:
        """A metrics line and the progress bar's numbers for the step just taken."""
        if not self.master:
            return
        state = self.state
        row = {"step": state.step, "loss": loss, "smma": state.smma.value, "lr": lr, "source": source,
               "tokens": state.tokens_seen, "tok_per_s": meter.tokens_per_s, "mfu": meter.mfu,
               "time": round(self.elapsed(), 3)}
        if grad_norm is not None:
            row["grad_norm"] = grad_norm
        if state.curriculum is not None:
            row["weights"] = state.curriculum.weights
        append_row(self.metrics_path, row)
        if bar is None:
            return
        post = {"loss": f"{loss:.3f}", "smma": f"{state.smma.value:.3f}", "tok/s": f"{meter.tokens_per_s:,.0f}"}
        if meter.mfu is not None:
            post["mfu"] = f"{100 * meter.mfu:.1f}%"
        if self.cfg.time_limit:
            post["left"] = _fmt_time(max(0.0, self.cfg.time_limit - self.elapsed()))
        if state.curriculum is not None:
            post["w"] = " ".join(f"{n[:4]}={w:.2f}" for n, w in state.curriculum.weights.items())
        bar.set_postfix(post, refresh=False)
        bar.update(1)

    def evaluate(self, say) -> tuple[int, dict | None]:
        """Validation loss and bits per byte per source, logged, plotted; (step, result). When the
        loss over every source is the lowest yet, this is the new best.safetensors."""
        step = self.state.step
        self.barrier()
        result = None
        if self.master or self.fsdp:  # a sharded model needs every process for a forward pass
            result = evaluate(self.model, self.data, self.cfg.seq_len, self.cfg.eval_windows,
                              self.cfg.micro_batch or self.cfg.batch_size,
                              self.byte_len, self.device, self.autocast)
        if self.any_rank(result is not None and not math.isfinite(result["all"]["loss"])):
            self.stop_on_bad_state(f"the validation loss became {result['all']['loss'] if result else 'NaN'} at step {step}")
        if self.master:
            append_row(self.metrics_path, {"step": step, "eval": result})
            parts = "  ".join(f"{n} {m['bpb']:.3f}" for n, m in result.items() if n != "all")
            say(f"step {step:,}: val loss {result['all']['loss']:.4f}, {result['all']['bpb']:.4f} bits/byte  ({parts})")
            self.draw("loss.png", lambda: plot_losses(self.metrics_path, self.out / "loss.png"), say)
            self.plot_curriculum()
            self.observe(evaluation=True)
            self.score_similarity(step, say)
        best = self.master and result["all"]["loss"] < self.state.best_val_loss
        if self.any_rank(best):  # every process takes part in a save (FSDP gathers the state)
            self.state.best_val_loss = result["all"]["loss"] if result is not None else self.state.best_val_loss
            self.state.evals_since_best = 0
            self.save("best.safetensors")
        else:
            self.state.evals_since_best += 1
        self.barrier()
        return step, result

    def audit(self, say) -> bool:
        """Generate a sample, score it, and say whether the audit halts the run."""

        auditor, step, halt = self.state.auditor, self.state.step, False
        if self.master or self.fsdp:  # under FSDP every process generates the same sample (same seed, same logits)
            self.model.eval()
            ids = generate_ids(self.model, [BOS], max_new_tokens=self.cfg.audit["tokens"], temperature=1.0, top_k=50,
                               seed=step, stop_at_bos=False)
            self.model.train()
        if self.master:
            text = self.tokenizer.decode([i for i in ids if i != BOS])
            score, parts = coherence_score(text, auditor.lexicon)
            halt = auditor.add(score)
            append_row(self.metrics_path, {"step": step, "audit": {"score": score, "components": parts, "text": text}})
            say(f"step {step:,}: sample audit {score:.0f}/100")
        if self.world > 1:
            t = torch.tensor([1.0 if halt else 0.0], device=self.device)
            dist.broadcast(t, 0)
            halt = bool(t.item())
        return halt

    def observe(self, evaluation: bool) -> None:
        """An embedding snapshot, when one is due at this step (see `andrea.snapshots.store`), and with
        it the scores of what each attention head attends to (andrea.inside.heads)."""
        if self.growth is None:
            return
        try:
            if self.growth.take(self.state.step, self.model, evaluation) is not None:
                record_heads(self.model, self.growth, self.metrics_path, self.state.step)
        except AndreaError as e:  # an observer: a snapshot that cannot be written never stops the training
            self.log(f"note: embedding snapshots stop for the rest of this run: {e}")
            self.growth = self.scorer = None

    def score_similarity(self, step: int, say) -> None:
        """The word-similarity scores of both tables, into metrics.jsonl (see `andrea.inside.wordsim`)."""
        if self.scorer is not None:
            score_similarity(self.model, self.scorer, self.growth, self.metrics_path, step, say)

    def _make_growth(self, ckpt):
        """The snapshot taker and the similarity scorer (index, sets) of this run, or None each."""
        if not self.cfg.snapshots or not self.master or self.fsdp:
            if self.cfg.snapshots and self.fsdp and self.master:
                self.log("note: embedding snapshots are not taken under --fsdp (the tables are sharded).")
            return None, None
        return make_growth(self.cfg, self.model_cfg, self.tokenizer, self.data, self.out, self.log,
                           ckpt, self.state.step)

    def checkpoint(self, final: bool = False) -> Path | None:
        """Save latest.safetensors (best.safetensors is written by `evaluate`). Every process takes
        part: under FSDP gathering the state is collective."""
        path = self.save("latest.safetensors")
        if final and self.master:
            self.plot_curriculum()
        return path

    def plot_curriculum(self) -> None:
        """Draw curriculum.png, unless it was drawn at this step already (the last evaluation and the
        final checkpoint fall on the same step)."""
        if self.state.curriculum is None or not self.state.curriculum.history or self.plotted_step == self.state.step:
            return
        self.draw("curriculum.png", lambda: plot_curriculum(self.state.curriculum.history, self.out / "curriculum.png"))
        self.plotted_step = self.state.step

    def draw(self, name: str, draw, say=None) -> None:
        """Draw one of the run's pictures. Pictures are observers: a failure is a note, and training goes on."""
        try:
            draw()
        except Exception as e:  # noqa: BLE001 (matplotlib raises what it likes; a picture never stops a run)
            (say or self.log)(f"note: could not draw {name} ({str(e).rstrip('.')}); training goes on")

    def save(self, *names: str) -> Path | None:
        """Write the run's state to each of `names` in the run folder, once it is proven sound:
        finite weights and moments, and a finite loss on a validation window. Returns the first
        path (on the main process)."""
        model_state = full_state(self.model, self.fsdp)
        optim_state = full_optim_state(self.optimizer, self.train_model, self.cfg.recipe, self.fsdp)
        if self.proven_step != self.state.step:  # nothing changes between saves at one step
            problem = self._state_problem(model_state, optim_state) if self.master else None
            if self.any_rank(problem is not None):
                self.stop_on_bad_state(problem or "another process found the state NaN or infinite")
            self.proven_step = self.state.step
        if not self.master:
            return None
        meta = {**self.state.state_dict(self.elapsed()), "train": self.cfg.to_dict(), "tokenizer": self.tokenizer.to_dict(),
                "data_fingerprint": self.data.manifest["tokenizer"]}
        if self.growth is not None:
            meta["growth"] = self.growth.state_dict()
        paths = [save_checkpoint(self.out / name, self.model_cfg, model_state, optim_state, meta) for name in names]
        if "latest.safetensors" in names:
            self.last_good = (self.out / "latest.safetensors", self.state.step)
        return paths[0]

    def _state_problem(self, model_state: dict, optim_state: dict) -> str | None:
        """Why the state at this step must not be saved, or None."""
        step = self.state.step
        for name, t in model_state.items():
            if not torch.isfinite(t).all():
                return f"the weight {name} became NaN or infinite by step {step}"
        for idx, per in optim_state.get("state", {}).items():
            for key, t in per.items():
                if torch.is_tensor(t) and not torch.isfinite(t).all():
                    return f"the optimizer's {key} (parameter {idx}) became NaN or infinite by step {step}"
        if not self.fsdp:  # the probe needs every process under FSDP; its weights were checked above
            loss = self._probe_loss()
            if not math.isfinite(loss):
                return f"the model's loss on a validation window became {loss} by step {step}"
        return None

    @torch.no_grad()
    def _probe_loss(self) -> float:
        x, y = (t.to(self.device) for t in self.probe)
        self.model.eval()
        try:
            with self.autocast:
                logits, _ = self.model(x)
        finally:
            self.model.train()
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item()

    def stop_on_bad_state(self, what: str) -> None:
        """Stop the run: the state went bad. Nothing of it is saved; the error names the last good
        checkpoint, the one to resume from (with a lower learning rate)."""
        if self.last_good is not None:
            path, step = self.last_good
            where = f"; the last good checkpoint is {path} (step {step:,}): resume from it, perhaps with a lower --lr"
        else:
            where = "; no checkpoint was written yet"
        raise AndreaError(f"{what}; training stopped and nothing of this state was saved{where}.")

    def leave_together(self) -> None:
        """Under torchrun, every process finishes here together, and the process group this run
        made is closed, so no process exits while another still talks to it."""
        if self.world > 1:
            dist.barrier()
            if self.made_group:
                dist.destroy_process_group()

    def close(self) -> None:
        """Release the run folder."""
        if getattr(self, "lock", None) is not None:
            self.lock.release()
            self.lock = None

    def say_why(self, stopped: str, path) -> None:
        if self.master and stopped == "signal":
            self.log(f"stopped by a signal at step {self.state.step:,}; checkpoint {path} (resume with --resume)")
        if self.master and stopped == "patience":
            self.log(f"validation stopped improving: {self.cfg.patience} evaluations in a row without a lower loss; "
                     f"stopped at step {self.state.step:,} (best.safetensors holds the best)")
        if self.master and stopped == "audit":
            a = self.state.auditor
            self.log(f"the sample audit halted training at step {self.state.step:,}: {a.patience} scores in a row below "
                     f"{a.threshold}; checkpoint {path}")

    # ---- small things the loop asks

    def elapsed(self) -> float:
        """Seconds of training, over every resumed part of the run."""
        return self.state.elapsed_before + (time.time() - self.t_start)

    def progress(self) -> float:
        """The fraction of the budget spent: steps over max_steps, or seconds over time_limit when
        only that is given. v3 takes the larger of the two when both are, so its decay ends where
        the run does."""
        cfg = self.cfg
        by_steps = self.state.step / cfg.max_steps if cfg.max_steps else None
        by_time = self.elapsed() / cfg.time_limit if cfg.time_limit else None
        if cfg.recipe == "v3" and by_steps is not None and by_time is not None:
            return max(by_steps, by_time)
        return by_steps if by_steps is not None else by_time

    def progress_bar(self):
        from tqdm import tqdm

        return tqdm(total=self.cfg.max_steps, initial=self.state.step, unit="step", dynamic_ncols=True, leave=True)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def _read_step(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> tuple[float, float | None, bool]:
        """The step's loss (averaged over processes), its gradient norm and whether every process's
        weights are still finite, read from the device together: the step's only wait for it."""
        finite = all_finite(local_part(p) for p in self.train_model.parameters()).to(loss.device)
        norm = grad_norm if grad_norm is not None else torch.zeros((), device=loss.device)
        values = torch.stack([loss.float(), norm.float().to(loss.device), (~finite).float()])
        if self.world > 1:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)  # the norm is the same on every process
            values[:2] /= self.world
        loss_value, norm_value, bad = values.tolist()
        return loss_value, (norm_value if grad_norm is not None else None), bad == 0

    def _grad_sync(self, last: bool):
        return grad_sync(self.model, self.train_model, self.fsdp, self.world, last)

    def any_rank(self, flag: bool) -> bool:
        return any_rank(flag, self.world, self.device)

    # ---- setup

    def _source_names(self) -> list[str]:
        names = self.data.names
        wanted = self.cfg.source_names()
        if not wanted:
            return names
        missing = [n for n in wanted if n not in names]
        if missing:
            raise AndreaError(f"source(s) {', '.join(missing)} are not in {self.data.dir}; it holds {', '.join(names)}.")
        return wanted

    def _describe(self, data_dir, resumed: bool) -> None:
        cfg, world = self.cfg, self.world
        atomic_write_bytes(self.out / "train.json", (json.dumps({"model": self.model_cfg.to_dict(), "train": cfg.to_dict(),
                                                                  "data": str(Path(data_dir).resolve()),
                                                                  "world_size": world}, indent=2) + "\n").encode())
        accum = self.accum
        self.log(f"model: {sum(p.numel() for p in self.model.parameters()):,} parameters on {self.device}"
                 f"{f' × {world} processes' if world > 1 else ''}; {self.tokens_per_step:,} tokens per step "
                 f"({cfg.batch_size} × {cfg.seq_len}, {accum} micro-batch{'es' if accum > 1 else ''} of {self.micro} per process)")
        if self.device.type == "cpu":
            self.log(processor_line(bf16_verdict(), cfg.recipe))
        if resumed:
            self.log(f"resuming {self.out} at step {self.state.step:,}")


# ---------------------------------------------------------------- helpers of the run


def _fmt_time(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _write_beside(bar, log, message: str) -> None:
    """Log a line where the log writes (not tqdm's default stdout), the progress bar stepping aside."""
    with bar.external_write_mode():
        log(message)


