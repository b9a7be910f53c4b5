"""What a training run carries from step to step besides weights and optimizer: the state a
checkpoint saves and `--resume` restores, in one place, every field checked before any is taken.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from andrea.checkpoint import Checkpoint, load_checkpoint
from andrea.errors import AndreaError
from andrea.optim_state import check_optimizer_fits
from andrea.trainconfig import TrainConfig
from andrea.validate import is_int, is_real


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


class RunState:
    """Everything of a run that changes from step to step, besides the weights and the optimizer:
    the step, tokens seen, seconds trained, the smoothed loss, the lowest validation loss, the data order's
    generator, the curriculum and the audit. `state_dict()` is what a checkpoint's metadata holds;
    `load_state_dict()` is what `--resume` reads. A checkpoint converted from another format holds
    only the step: the rest then starts afresh from the run's seed."""

    def __init__(self, cfg: TrainConfig, curriculum=None, auditor=None):
        self.step, self.tokens_seen, self.elapsed_before = 0, 0, 0.0
        self.smma = SMMA(cfg.smma_window)
        self.best_val_loss = float("inf")
        self.evals_since_best = 0  # evaluations in a row that did not lower the validation loss
        self.data_rng = np.random.default_rng(cfg.seed)
        self.curriculum, self.auditor = curriculum, auditor

    def state_dict(self, elapsed: float) -> dict:
        d = {"step": self.step, "tokens_seen": self.tokens_seen, "best_val_loss": self.best_val_loss,
             "evals_since_best": self.evals_since_best,
             "smma": self.smma.state_dict(), "elapsed": elapsed, "data_rng": self.data_rng.bit_generator.state}
        if self.curriculum is not None:
            d["curriculum"] = self.curriculum.state_dict()
        if self.auditor is not None:
            d["audit"] = self.auditor.state_dict()
        return d

    def load_state_dict(self, meta: dict, where="the checkpoint") -> None:
        """Restore from a checkpoint's metadata; every field is checked before any is taken."""
        def bad(field, value):
            raise AndreaError(f"{where}: its run state field {field!r} is damaged (found {str(value)[:60]!r}).")

        step, tokens, waited = meta.get("step", 0), meta.get("tokens_seen", 0), meta.get("evals_since_best", 0)
        best, elapsed = meta.get("best_val_loss", float("inf")), meta.get("elapsed", 0.0)
        for field, value in (("step", step), ("tokens_seen", tokens), ("evals_since_best", waited)):
            if not is_int(value) or value < 0:
                bad(field, value)
        if not is_real(best) or math.isnan(best) or best == -math.inf:
            bad("best_val_loss", best)
        if not is_real(elapsed) or not 0 <= elapsed < math.inf:
            bad("elapsed", elapsed)
        smma = meta.get("smma", self.smma.state_dict())
        if (not isinstance(smma, dict) or not is_int(smma.get("window")) or smma["window"] < 1
                or not is_int(smma.get("n")) or not 0 <= smma["n"] <= smma["window"] or not is_real(smma.get("value"))
                or (smma["n"] > 0 and not math.isfinite(smma["value"]))):
            bad("smma", smma)
        parts = {}  # the curriculum's and the audit's state, checked against this run's sources
        for field, part in (("curriculum", self.curriculum), ("audit", self.auditor)):
            if part is not None and field in meta:
                try:
                    parts[field] = part.check_state(meta[field]) if field == "audit" else part.check_state(meta[field], step)
                except AndreaError as e:
                    raise AndreaError(f"{where}: {e}") from None
        rng = np.random.default_rng()
        if "data_rng" in meta:
            try:
                rng.bit_generator.state = meta["data_rng"]
            except (TypeError, ValueError, KeyError, OverflowError):
                bad("data_rng", meta["data_rng"])
        if "rng_torch" in meta:
            saved = torch.get_rng_state()
            try:
                torch.set_rng_state(meta["rng_torch"])
            except (RuntimeError, TypeError):
                bad("rng.torch", "a tensor torch does not accept")
            finally:
                torch.set_rng_state(saved)
        # everything is well formed: take it
        self.step, self.tokens_seen, self.best_val_loss, self.elapsed_before = step, tokens, float(best), float(elapsed)
        self.evals_since_best = waited
        self.smma.load_state_dict(smma)
        if "data_rng" in meta:
            self.data_rng = rng
        if "curriculum" in parts:
            self.curriculum.load_state_dict(meta["curriculum"], step)
        if "audit" in parts:
            self.auditor.streak, self.auditor.scores = parts["audit"]
        if "rng_torch" in meta:
            torch.set_rng_state(meta["rng_torch"])


def checkpoint_to_resume(out: Path, model_cfg, cfg: TrainConfig, data) -> Checkpoint:
    """The run folder's latest checkpoint, checked to belong to this run: the same model config,
    batch, context, recipe, sampling and seed, data of the same tokenizer, and an optimizer state
    of this model's parameter groups."""
    latest = out / "latest.safetensors"
    if not latest.exists():
        raise AndreaError(f"there is no checkpoint to resume from in {out}.")
    ckpt = load_checkpoint(latest)
    if ckpt.config != model_cfg:
        raise AndreaError(f"{latest} was trained with another model config ({ckpt.config.to_dict()}); "
                          f"resume with the same preset or config.")
    saved = ckpt.meta.get("train", {})
    for key in ("batch_size", "seq_len", "recipe", "sampling", "seed"):
        if key in saved and saved[key] != getattr(cfg, key):
            raise AndreaError(f"{latest} was trained with {key} = {saved[key]!r}, not {getattr(cfg, key)!r}; "
                              f"resume with the same settings.")
    if ckpt.meta.get("data_fingerprint") not in (None, data.manifest["tokenizer"]):
        raise AndreaError(f"{latest} was trained on data made with another tokenizer than {data.dir}.")
    if ckpt.optim_state is not None and ckpt.optim_state["state"]:
        check_optimizer_fits(ckpt.optim_state, model_cfg, cfg.recipe, latest)
    return ckpt
