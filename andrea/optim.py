"""The optimizer of each recipe: which parameters it updates in which group and order, and the
learning-rate schedule.

The order matters beyond training: a checkpoint stores the optimizer's state by parameter index,
and the .bin format stores Adam's moments by parameter name, so `andrea.formats` builds the same
groups here (on the meta device, without memory) to translate between the two.

  v1   Adam (β 0.9/0.999), one group of every parameter in the model's order, constant lr.
  v2   AdamW (β 0.9/0.95): group 0 the matrices (dim ≥ 2) with weight decay, group 1 the
       vectors (norm gains and biases) without; linear warm-up into cosine decay.
  v3   Muon for the matrices of the blocks (group 0: attention's wq wk wv wo, the MLP's fc1 fc2),
       AdamW (β 0.9/0.95) for the rest: group 1 the two lookup tables and the head, with weight
       decay, group 2 the vectors without. Muon orthogonalizes each matrix's momentum (Newton-
       Schulz) and scales its step to the RMS AdamW's would have (`match_rms_adamw`), so one
       learning rate and one weight decay serve both; `muon_lr` may set the matrices' own. The
       schedule is warm-up, stable, decay (WSD): linear warm-up over warmup_steps, the peak until
       the last `decay_fraction` of the budget, then linearly to zero, so a run that stops on its
       time limit ends annealed. The two optimizers are one `Optimizers` object with one state
       dict, in the global group order above, so checkpoints, resume and DDP/FSDP see one optimizer.

Muon is torch's (`torch.optim.Muon`: its parameter groups, state and checkpoints) with one
change, `andrea.optim.Muon`: the Newton-Schulz products run in a number format chosen for the
device (`andrea.processor.compute_dtype`), where torch's always casts to bfloat16, which
a CPU without native bf16 emulates about a hundred times slower than float32. In bfloat16 its
step equals torch's exactly (tests/test_optim.py).
"""

from __future__ import annotations

import math
import re

import torch

from andrea.errors import AndreaError
from andrea.processor import compute_dtype
from andrea.trainconfig import DEFAULT_LR, RECIPES

MUON = "muon"  # the `optimizer` key of a v3 group trained by Muon

_BLOCK_MATRIX = re.compile(r"(^|\.)h\.\d+\.(attn|mlp)\.[^.]+\.weight$")


def check_recipe(recipe: str) -> None:
    if recipe not in RECIPES:
        raise AndreaError(f"recipe must be one of {', '.join(RECIPES)}, got {recipe!r}.")


def is_block_matrix(name: str, p: torch.Tensor) -> bool:
    """A 2-D weight inside a block (attention or MLP): what v3 trains with Muon. The name may carry
    a wrapper's prefix (DDP's `module.`)."""
    return p.dim() == 2 and _BLOCK_MATRIX.search(name) is not None


def param_groups(model: torch.nn.Module, recipe: str, weight_decay: float = 0.1) -> list[dict]:
    """The optimizer's parameter groups, each with the `names` of its parameters in order (and,
    for v3, the `optimizer` that trains it: "muon" or "adamw")."""
    check_recipe(recipe)
    named = list(model.named_parameters())
    if recipe == "v1":
        return [{"params": [p for _, p in named], "names": [n for n, _ in named]}]

    def group(items, wd, **extra):
        return {"params": [p for _, p in items], "names": [n for n, _ in items], "weight_decay": wd, **extra}

    no_decay = [(n, p) for n, p in named if p.dim() < 2]
    if recipe == "v2":
        return [group([(n, p) for n, p in named if p.dim() >= 2], weight_decay), group(no_decay, 0.0)]
    muon = [(n, p) for n, p in named if is_block_matrix(n, p)]
    adam = [(n, p) for n, p in named if p.dim() >= 2 and not is_block_matrix(n, p)]
    return [group(muon, weight_decay, optimizer=MUON), group(adam, weight_decay, optimizer="adamw"),
            group(no_decay, 0.0, optimizer="adamw")]


def param_names_in_order(model: torch.nn.Module, recipe: str) -> list[str]:
    """Parameter names in the order the recipe's optimizer numbers them (group by group)."""
    return [n for g in param_groups(model, recipe) for n in g["names"]]


def make_optimizer(model: torch.nn.Module, recipe: str, lr: float | None = None, weight_decay: float = 0.1,
                   device: torch.device | str = "cpu", muon_lr: float | None = None) -> torch.optim.Optimizer:
    """The recipe's optimizer. Every group carries `lr_scale`: the schedule sets each group's lr to
    the scheduled lr times it (1, or muon_lr / lr for v3's Muon group)."""
    lr = DEFAULT_LR[recipe] if lr is None else lr
    device = torch.device(device)
    # one fused kernel for all parameters: ~3x faster steps on CPU too (not for meta tensors)
    fused = True if device.type in ("cuda", "cpu") else None
    groups = [{k: v for k, v in g.items() if k not in ("names", "optimizer")} | {"lr_scale": 1.0}
              for g in param_groups(model, recipe, weight_decay)]
    if recipe == "v1":
        return torch.optim.Adam(groups, lr=lr, betas=(0.9, 0.999), fused=fused)
    if recipe == "v2":
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused)
    scale = 1.0 if muon_lr is None else muon_lr / lr
    muon = Muon([{**groups[0], "lr": lr * scale, "lr_scale": scale}], lr=lr * scale, weight_decay=weight_decay,
                momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw", ns_dtype=compute_dtype(device))
    adamw = torch.optim.AdamW(groups[1:], lr=lr, betas=(0.9, 0.95), fused=fused)
    return Optimizers([muon, adamw])


class Muon(torch.optim.Muon):
    """torch's Muon whose orthogonalization runs in `ns_dtype` (torch's: bfloat16 always). The
    groups and the state (`momentum_buffer`) are torch's, so checkpoints read either way; the
    dtype is the optimizer's, not a group's, so a saved state dict is the same as torch's."""

    def __init__(self, params, *, ns_dtype: torch.dtype = torch.bfloat16, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            lr, decay, mu = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                p.mul_(1 - lr * decay)
                p.add_(update, alpha=-lr * muon_lr_ratio(group["adjust_lr_fn"], p.shape))
        return loss


def closure_loss(closure):
    """The loss a torch optimizer's `step(closure)` returns: the closure run with gradients on, or None."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def orthogonalize(g: torch.Tensor, coefficients, steps: int, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """Newton-Schulz's quintic iteration towards the nearest semi-orthogonal matrix to `g` (its
    singular values pushed to about 1), computed in `dtype` on a copy: torch's iteration, with
    its coefficients and its order of products."""
    a, b, c = coefficients
    x = g.to(dtype, copy=True)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def muon_lr_ratio(adjust: str | None, shape) -> float:
    """What Muon multiplies the learning rate by for a matrix of `shape`: sqrt(max(1, A/B))
    ("original"), 0.2·sqrt(max(A, B)) so the step's RMS matches AdamW's ("match_rms_adamw")."""
    rows, cols = shape[:2]
    if adjust in (None, "original"):
        return math.sqrt(max(1, rows / cols))
    if adjust == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


class Optimizers(torch.optim.Optimizer):
    """Several optimizers stepped as one: `param_groups` is their groups in order (the same dict
    objects, so setting a group's lr reaches the optimizer that owns it) and `state` is one table
    they all write to, so `state_dict()` numbers every parameter in one global order and
    `load_state_dict()` restores each optimizer's part. To the rest of the code (checkpoints,
    resume, FSDP's state gathering) it is one optimizer with a torch optimizer's state dict."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = list(optimizers)
        super().__init__([p for o in self.optimizers for g in o.param_groups for p in g["params"]], {})
        self.param_groups = [g for o in self.optimizers for g in o.param_groups]
        self._share()

    def _share(self) -> None:
        """Hand each optimizer its slice of `param_groups` and the one state table."""
        start = 0
        for o in self.optimizers:
            n = len(o.param_groups)
            o.param_groups, o.state = self.param_groups[start : start + n], self.state
            start += n

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # rebuilds the groups and the state as new objects
        self._share()

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for o in self.optimizers:
            o.step()
        return loss


def lr_at(recipe: str, lr: float, step: int, progress: float, warmup_steps: int, min_lr_ratio: float,
          decay_fraction: float = 0.3) -> float:
    """v1: constant. v2: linear warm-up over warmup_steps, then cosine to min_lr_ratio × lr.
    v3: linear warm-up over warmup_steps, constant, then linear to 0 over the last
    `decay_fraction` of the run.

    `progress` is the fraction of the run done: step / max_steps, or elapsed / time_limit when
    only a time limit is given (v3: the larger of the two when both are).
    """
    if recipe == "v1":
        return lr
    warm = lr * (step + 1) / warmup_steps if step < warmup_steps else lr
    progress = min(1.0, max(0.0, progress))
    if recipe == "v3":
        left = 1.0 - progress
        return warm * (min(1.0, left / decay_fraction) if decay_fraction > 0 else 1.0)
    if step < warmup_steps:
        return warm
    cos = 0.5 * (1 + math.cos(math.pi * progress))
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * cos)
