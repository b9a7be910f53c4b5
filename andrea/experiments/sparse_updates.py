"""The sparse-update experiment: which rows of the embedding table move at a step whose batch
does not contain their token.

The input table wte is indexed, so a row gets gradient only where its token occurs in the batch's
input; the rows of every other token get a gradient of exactly zero. Whether they move anyway is
the optimizer's business:

    SGD          no momentum, no weight decay: a zero gradient is a zero update, the row stays
                 bit-identical.
    Adam (v1)    no weight decay. A row seen in an earlier batch keeps moving through its first
                 moment m (β1 0.9 keeps about 1/(1 − β1) = 10 steps of it); a row never seen has
                 m = v = 0, and m̂/(√v̂ + ε) is then exactly 0: it stays bit-identical.
    AdamW (v2)   wte is a matrix, so it is in v2's decayed group (weight decay 0.1): decoupled
                 weight decay multiplies every row by 1 − lr·wd each step, seen or not, and rows
                 seen earlier also move through momentum.
    v3           Muon trains only the blocks' matrices; wte sits in v3's AdamW group with weight
                 decay, so its rows behave as under AdamW.

The output head lm_head is the other way round: the softmax runs over the whole vocabulary, so
every row gets a nonzero gradient at every step. (torch.optim.SparseAdam is the lazy
alternative: it updates only the rows that have a gradient.)

Each optimizer trains the same model (same initial weights) on the same batches for `steps` steps,
at a constant learning rate (each recipe's default; SGD's is `SGD_LR`), with the trainer's gradient
clipping for v2 and v3. The text is a prepared data folder, or by default the package's own
documentation (the docstrings of andrea's modules), tokenized by a small Harris tokenizer trained
on it: the same small corpus on every machine, nothing fetched.

`sparse_updates` returns the measurements as plain data; `markdown_table`, `explanation` and
`plot_sparse_updates` turn them into text and a picture, `write_results` into files.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.files import atomic_write_bytes
from andrea.model import ANDREA
from andrea.optim import make_optimizer
from andrea.plots import pyplot, save_figure
from andrea.shards import open_token_data
from andrea.tokenizer.train import train_tokenizer
from andrea.validate import check_seed

OPTIMIZERS = ("sgd", "adam", "adamw", "v3")
LABELS = {"sgd": "SGD", "adam": "Adam (v1)", "adamw": "AdamW (v2)", "v3": "Muon + AdamW (v3)"}
RECIPE = {"adam": "v1", "adamw": "v2", "v3": "v3"}
SGD_LR = 0.5  # plain SGD needs a far larger step than Adam: a row's gradient is its token's share of the batch
WEIGHT_DECAY = 0.1  # the trainer's default for v2 and v3
GRAD_CLIP = 1.0  # the trainer's default clip for v2 and v3
BUILTIN_SEGMENTS = 500  # the built-in corpus's tokenizer: 257 bytes and BOS + 500 segments


@dataclass
class SparseUpdatesExperiment:
    data_dir: Path | None = None  # a folder made by `andrea prepare`; None: the package's own docstrings
    steps: int = 50
    batch_size: int = 8
    seq_len: int = 64
    seed: int = 1337
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2

    def check(self) -> None:
        for name, high in (("steps", 100_000), ("batch_size", 4096), ("seq_len", 4096)):
            value, flag = getattr(self, name), name.replace("_", "-")
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AndreaError(f"{flag} must be at least 1, got {str(value)[:40]}.")
            if value > high:
                raise AndreaError(f"{flag} must be at most {high:,}, got {value:,}.")
        check_seed(self.seed)


# ---------------------------------------------------------------- the batches


def package_texts() -> list[str]:
    """The docstrings of andrea's own modules, classes and functions, in path order."""
    import andrea

    texts = []
    for path in sorted(Path(andrea.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    texts.append(doc)
    return texts


def make_batches(exp: SparseUpdatesExperiment) -> tuple[list, int, str]:
    """`steps` batches (x, y) of (batch_size, seq_len) tokens, the vocabulary size, and a line
    saying where the text came from."""
    rng = np.random.default_rng(exp.seed)
    B, T = exp.batch_size, exp.seq_len
    if exp.data_dir is not None:

        data = open_token_data(exp.data_dir)
        data.check_context(T)
        names, shares = data.names, np.array(list(data.token_share().values()))
        batches = []
        for _ in range(exp.steps):
            name = names[int(rng.choice(len(names), p=shares / shares.sum()))]
            batches.append(data.windows(name, data.sample_offsets(name, B, T, rng), T))
        total = sum(len(s.train) for s in data.sources.values())
        return batches, data.vocab_size, f"{exp.data_dir} ({', '.join(names)}; {total:,} training tokens)"

    texts = package_texts()
    tok = train_tokenizer(texts, BUILTIN_SEGMENTS)
    stream = torch.tensor([i for t in texts for i in tok.encode(t)], dtype=torch.int64)
    if len(stream) < T + 2:
        raise AndreaError(f"the built-in corpus has {len(stream):,} tokens, fewer than one window of {T + 1}.")
    starts = torch.from_numpy(rng.integers(0, len(stream) - T, size=(exp.steps, B)))
    offsets = torch.arange(T + 1)
    batches = [(w[:, :-1], w[:, 1:]) for w in (stream[s[:, None] + offsets] for s in starts)]
    return batches, tok.vocab_size, (f"andrea's own docstrings ({len(texts)} texts, {len(stream):,} tokens, "
                                     f"a {BUILTIN_SEGMENTS}-segment Harris tokenizer trained on them)")


# ---------------------------------------------------------------- one optimizer's run


def build_optimizer(name: str, model) -> tuple[torch.optim.Optimizer, dict]:
    """The optimizer and the facts the explanation needs, read from the group that holds wte: its
    lr, momentum (β1, or SGD's momentum) and weight decay; and the gradient clip."""

    if name == "sgd":
        opt, clip = torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=0.0, weight_decay=0.0), None
    else:
        opt = make_optimizer(model, RECIPE[name], weight_decay=WEIGHT_DECAY)
        clip = None if RECIPE[name] == "v1" else GRAD_CLIP
    (group,) = [g for g in opt.param_groups if any(p is model.wte.weight for p in g["params"])]
    beta1 = group["betas"][0] if "betas" in group else group["momentum"]
    return opt, {"recipe": RECIPE.get(name), "lr": group["lr"], "clip": clip, "beta1": beta1,
                 "wte_weight_decay": group["weight_decay"]}


def train_and_measure(name: str, cfg: ModelConfig, batches: list, seed: int) -> dict:
    """Train a fresh model (the same initial weights for every optimizer) on the batches and, at
    every step, measure how far each row of wte moved and which head rows had a gradient."""

    torch.manual_seed(seed)
    model = ANDREA(cfg).train()
    opt, facts = build_optimizer(name, model)
    wte, head = model.wte.weight, model.lm_head.weight
    seen = torch.zeros(cfg.vocab_size, dtype=torch.bool)  # tokens in the input of an earlier batch
    steps = []
    for x, y in batches:
        before = wte.detach().clone()
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, targets=y)
        loss.backward()
        head_grad = (head.grad != 0).any(dim=1).double().mean().item()
        if facts["clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), facts["clip"])
        opt.step()
        present = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        present[x.unique()] = True
        steps.append(step_record(before, wte.detach(), present, seen, loss.item(), head_grad))
        seen |= present
    return {"optimizer": name, "label": LABELS[name], **facts, "steps": steps, "summary": summarize(steps)}


def _share(mask: torch.Tensor) -> float | None:
    return mask.double().mean().item() if len(mask) else None


def step_record(before, after, present, seen, loss: float, head_grad: float) -> dict:
    """One step's movement of the rows of tokens present in the batch's input and absent from it;
    the absent ones split into those seen in an earlier batch and those never seen."""
    delta = (after.double() - before.double()).norm(dim=1)
    moved = (after != before).any(dim=1)
    absent = ~present

    def mean(mask):
        return delta[mask].mean().item() if mask.any() else None

    return {
        "loss": loss, "present": int(present.sum()), "absent": int(absent.sum()),
        "absent_seen": int((absent & seen).sum()),
        "present_delta": mean(present), "absent_delta": mean(absent),
        "absent_seen_delta": mean(absent & seen), "absent_never_delta": mean(absent & ~seen),
        "present_moved": _share(moved[present]),
        "absent_moved": _share(moved[absent]),
        "absent_seen_moved": _share(moved[absent & seen]),
        "absent_never_moved": _share(moved[absent & ~seen]),
        "head_grad": head_grad,
    }


SUMMED = ("present_delta", "absent_delta", "absent_seen_delta", "absent_never_delta", "present_moved", "absent_moved", "absent_seen_moved",
          "absent_never_moved", "head_grad")


def summarize(steps: list[dict]) -> dict:
    """The mean of each measure over the steps where it is defined (None where it never is), the
    first and last loss, and at how many steps every head row had a gradient."""
    out = {}
    for key in SUMMED:
        values = [s[key] for s in steps if s[key] is not None]
        out[key] = sum(values) / len(values) if values else None
    out["head_all_steps"] = sum(s["head_grad"] == 1.0 for s in steps)
    out["absent_moved_steps"] = sum((s["absent_moved"] or 0) > 0 for s in steps)
    out["first_loss"], out["last_loss"] = steps[0]["loss"], steps[-1]["loss"]
    return out


# ---------------------------------------------------------------- the experiment


def sparse_updates(exp: SparseUpdatesExperiment, log=print) -> dict:
    """Every optimizer's run on the same batches: the settings and one row per optimizer."""
    exp.check()
    batches, V, corpus = make_batches(exp)
    cfg = ModelConfig(vocab_size=V, n_embd=exp.n_embd, n_head=exp.n_head, n_layer=exp.n_layer, block_size=exp.seq_len)
    rows = []
    for n, name in enumerate(OPTIMIZERS, 1):
        log(f"[{n}/{len(OPTIMIZERS)}] {LABELS[name]}: {exp.steps} steps")
        rows.append(train_and_measure(name, cfg, batches, exp.seed))
    settings = {"steps": exp.steps, "batch_size": exp.batch_size, "seq_len": exp.seq_len, "seed": exp.seed,
                "corpus": corpus, "data_dir": None if exp.data_dir is None else str(exp.data_dir),
                "model": cfg.to_dict()}
    return {"settings": settings, "rows": rows}


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.2e}"


def explanation(row: dict) -> str:
    """One sentence: whether the absent rows moved, and why (momentum, weight decay)."""
    s, wd, lr, b1 = row["summary"], row["wte_weight_decay"], row["lr"], row["beta1"]
    head = f"{row['label']}: {_pct(s['absent_moved'])} of absent rows moved per step"
    if not s["absent_moved"]:
        return (head + ": an absent token's row gets a gradient of exactly zero, and with no momentum and no weight "
                       "decay a zero gradient is a zero update, so the row stays bit-identical.")
    reasons = []
    if wd > 0 and s["absent_never_moved"]:
        reasons.append(f"decoupled weight decay multiplies every row of wte by 1 − lr·wd = {1 - lr * wd:.6g} at each "
                       f"step, so even rows never seen move (‖Δ‖ {_num(s['absent_never_delta'])})")
    if b1 > 0 and s["absent_seen_moved"]:
        further = " further" if reasons else ""
        reasons.append(f"momentum (β1 {b1:g}) keeps applying a row's past gradients for about {1 / (1 - b1):.0f} "
                       f"steps after its token was last in a batch, so rows seen before move{further} "
                       f"(‖Δ‖ {_num(s['absent_seen_delta'])})")
    if b1 > 0 and wd == 0 and s["absent_never_moved"] == 0:
        reasons.append("rows never seen have m = 0, so m̂/(√v̂ + ε) is exactly 0 and they stay bit-identical")
    if not reasons:
        reasons.append("neither momentum nor weight decay accounts for it")
    return head + ": " + "; ".join(reasons) + "."


def markdown_table(summary: dict) -> str:
    st, m = summary["settings"], summary["settings"]["model"]
    lines = [
        f"Sparse updates: d_model {m['n_embd']}, {m['n_head']} heads, {m['n_layer']} layers, V {m['vocab_size']:,}; "
        f"{st['steps']} steps of {st['batch_size']} × {st['seq_len']} tokens, the same batches and initial weights "
        f"for every optimizer, seed {st['seed']}, constant learning rate; text: {st['corpus']}.",
        "",
        "| optimizer | lr | wte weight decay | present: ‖Δ‖ | absent: ‖Δ‖ | absent: moved | seen before: ‖Δ‖ | "
        "seen before: moved | never seen: ‖Δ‖ | never seen: moved | head rows with gradient | loss first → last |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summary["rows"]:
        s = r["summary"]
        lines.append(f"| {r['label']} | {r['lr']:g} | {r['wte_weight_decay']:g} | {_num(s['present_delta'])} | "
                     f"{_num(s['absent_delta'])} | {_pct(s['absent_moved'])} | {_num(s['absent_seen_delta'])} | "
                     f"{_pct(s['absent_seen_moved'])} | {_num(s['absent_never_delta'])} | "
                     f"{_pct(s['absent_never_moved'])} | {_pct(s['head_grad'])} | "
                     f"{s['first_loss']:.3f} → {s['last_loss']:.3f} |")
    all_head = all(r["summary"]["head_all_steps"] == st["steps"] for r in summary["rows"])
    lines += [
        "",
        "Means over the steps. Present: tokens in the step's input batch, absent: every other token, split into those "
        "seen in an earlier step's batch and those never seen. ‖Δ‖: how far a row of wte moved at the step; moved: "
        "the share of rows of which any bit changed.",
        "",
        *[explanation(r) for r in summary["rows"]],
        "",
        ("The head: every row of lm_head had a nonzero gradient at every step under every optimizer (the softmax "
         "runs over the whole vocabulary)." if all_head else
         "The head: some rows of lm_head had a zero gradient at some step (a probability that rounded to zero)."),
    ]
    return "\n".join(lines)


def write_results(summary: dict, out_dir) -> dict:
    """sparse_updates.md, sparse_updates.json and sparse_updates.png in out_dir; their paths."""

    out = Path(out_dir)
    md = markdown_table(summary)
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / "sparse_updates.md", (md + "\n").encode())
        atomic_write_bytes(out / "sparse_updates.json", (json.dumps(summary, indent=2) + "\n").encode())
    except OSError as e:
        raise AndreaError(f"cannot write the results to {out} ({e.strerror}).") from None
    png = plot_sparse_updates(summary, out / "sparse_updates.png")
    return {"markdown": md, "markdown_path": out / "sparse_updates.md", "json_path": out / "sparse_updates.json",
            "png": png}


def plot_sparse_updates(summary: dict, path) -> Path:
    """Per optimizer over the steps: ‖Δ‖ of present and absent rows, the share of absent rows that
    moved, and the share of head rows with a gradient."""

    plt = pyplot()
    fig, (ax, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.6), dpi=100)
    for i, r in enumerate(summary["rows"]):
        t = np.arange(1, len(r["steps"]) + 1)
        present = [s["present_delta"] for s in r["steps"]]
        absent = [s["absent_delta"] if s["absent_delta"] else math.nan for s in r["steps"]]
        ax.plot(t, present, color=f"C{i}", label=f"{r['label']}: present")
        zero = all(math.isnan(a) for a in absent)
        ax.plot(t, absent, color=f"C{i}", ls="--", label=f"{r['label']}: absent" + (" (0 at every step)" if zero else ""))
        # the shares often coincide (0 or 1 for several optimizers): markers shrink so each stays visible
        style = dict(color=f"C{i}", marker="osD."[i % 4], markersize=8 - 2 * (i % 4), label=r["label"])
        ax2.plot(t, [s["absent_moved"] for s in r["steps"]], **style)
        ax3.plot(t, [s["head_grad"] for s in r["steps"]], **style)
    ax.set_yscale("log"), ax.set_xlabel("step"), ax.set_ylabel("mean ‖Δ‖ of a wte row at the step")
    ax.set_title("how far rows moved: present (solid) vs absent (dashed)", fontsize=10)
    ax2.set_ylim(-0.05, 1.05), ax2.set_xlabel("step"), ax2.set_ylabel("share")
    ax2.set_title("absent rows that moved at all", fontsize=10)
    ax3.set_ylim(-0.05, 1.05), ax3.set_xlabel("step"), ax3.set_ylabel("share")
    ax3.set_title("lm_head rows with a nonzero gradient", fontsize=10)
    for a in (ax, ax2, ax3):
        a.grid(alpha=0.3), a.legend(fontsize=7)
    st = summary["settings"]
    fig.suptitle(f"sparse updates of the input table: {st['steps']} steps, the same batches for every optimizer "
                 f"(V {st['model']['vocab_size']:,})", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
