"""What the state checks of training cost, beside the training step they guard.

A training step (forward, cross-entropy, backward, optimizer step) is timed side by side with
  after-step    the check after every optimizer step: every weight finite, one synchronisation
  before-save   the check before every checkpoint: weights and the optimizer's state finite, and the
                model's loss on one validation window (one forward pass of one sequence)
on the same model (the main job's recipe and optimizer unless --recipe says otherwise), in
alternating rounds so that both share the machine's conditions; the best
round of each is reported, and the ratios to the step.

    .venv/bin/python benchmarks/bench_guard.py [--preset andrea-cpu] [--batch 32] [--seq 128] [--recipe v3] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from andrea.config import PRESETS  # noqa: E402
from andrea.distributed import all_finite as _finite  # noqa: E402
from andrea.mainjob_settings import MAIN_RECIPE, RECIPE_SETTINGS  # noqa: E402
from andrea.model import ANDREA  # noqa: E402
from andrea.optim import make_optimizer  # noqa: E402


def best_time(fn, device, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="andrea-cpu")
    ap.add_argument("--batch", type=int, default=32)  # the main job's step: 32 × 128
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--recipe", choices=sorted(RECIPE_SETTINGS), default=MAIN_RECIPE)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    cfg = PRESETS[args.preset]
    torch.manual_seed(0)
    model = ANDREA(cfg).to(device)
    settings = RECIPE_SETTINGS[args.recipe]
    opt = make_optimizer(model, args.recipe, settings["lr"], 0.1, device, muon_lr=settings.get("muon_lr"))
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), device=device)
    probe = ids[:1]

    def step():
        _, loss = model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    def after_step():
        assert bool(_finite(p.detach() for p in model.parameters()))  # one synchronisation

    @torch.no_grad()
    def before_save():
        state = opt.state_dict()["state"]
        assert bool(_finite(p.detach() for p in model.parameters()))  # one synchronisation
        assert bool(_finite(t for per in state.values() for t in per.values() if torch.is_tensor(t)))
        model.eval()
        logits, _ = model(probe[:, :-1])
        model.train()
        assert torch.isfinite(F.cross_entropy(logits.float().flatten(0, 1), probe[:, 1:].flatten()))

    step()  # warm up: Adam's state exists from here on
    times = {"step": [], "after-step": [], "before-save": []}
    for _ in range(args.rounds):
        times["step"].append(best_time(step, device, 3))
        times["after-step"].append(best_time(after_step, device, 10))
        times["before-save"].append(best_time(before_save, device, 3))
    best = {k: min(v) for k, v in times.items()}
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.preset} ({params:,} parameters), batch {args.batch} × {args.seq}, recipe {args.recipe}, {device.type}, "
          f"{torch.get_num_threads()} threads")
    print()
    print("| what | best time | × of a step |")
    print("|---|---:|---:|")
    for name, t in best.items():
        print(f"| {name} | {t * 1e3:.2f} ms | {t / best['step']:.4f} |")


if __name__ == "__main__":
    main()
