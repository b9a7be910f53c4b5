"""Every picture andrea draws, and the one way it draws and saves them.

matplotlib runs on its Agg backend (no screen needed) with mathtext off: a label is drawn as
written, so a source's file name or a token such as `$\\frac` is text, never a formula that fails
to parse. `save_figure` writes a PNG atomically (a temporary file renamed into place), so a
picture is either the old one or the new one, never cut off; a failed write is one sentence.
matplotlib is imported when a picture is first drawn: a command that draws none never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from andrea.errors import AndreaError
from andrea.files import atomic_output, write_error_reason
from andrea.metrics import loss_curves, read_metrics

if TYPE_CHECKING:
    from andrea.inside.embed import ParamGroup


def pyplot():
    """matplotlib.pyplot on the Agg backend, mathtext off."""
    import matplotlib  # heavy: loaded only when a picture is drawn

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def plain_text(fig):
    """`fig`, with every text in it drawn as written (for figures made without `pyplot`)."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_parse_math(False)
    return fig


def save_figure(fig, path) -> Path:
    """Write `fig` to `path` as a PNG, atomically (folders made), close it, and return the path."""
    path = Path(path)
    plain_text(fig)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path) as tmp:
            fig.savefig(tmp, format="png")
    except OSError as e:
        raise AndreaError(f"cannot write the picture {path} ({write_error_reason(e)}).") from None
    finally:
        pyplot().close(fig)
    return path


def plot_parameter_groups(groups: list[ParamGroup], path, title: str) -> Path:
    plt = pyplot()
    parts = [g for g in groups if g.part]
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    colors = ["C0", "C1", "0.6", "0.8", "C2"]
    y = np.arange(len(parts))[::-1]
    ax.barh(y, [g.count for g in parts], color=colors[: len(parts)])
    for yi, g in zip(y, parts):
        share = f"{100 * g.share:.1f}%" if g.share >= 0.001 else f"{100 * g.share:.3f}%"
        ax.text(g.count, yi, f"  {g.count:,} ({share})", va="center", fontsize=9)
    ax.set_yticks(y, [f"{g.name}\n{g.shape}" for g in parts], fontsize=9)
    ax.set_xlim(0, max(g.count for g in parts) * 1.45)
    ax.set_xlabel("parameters")
    ax.xaxis.set_major_formatter(lambda v, _: f"{v / 1e6:g}M" if v else "0")
    total = groups[-1].count
    emb = next(g for g in groups if g.name == "embedding total")
    ax.set_title(f"{title}\n{total:,} parameters; embedding layer {emb.count:,} ({100 * emb.share:.1f}%)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_position_similarity(sim: np.ndarray, at: dict, path, title: str) -> Path:
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.8), dpi=100, gridspec_kw={"width_ratios": [1.1, 1]})
    im = ax.imshow(sim, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="cos θ")
    ax.set_xlabel("position"), ax.set_ylabel("position")
    ax.set_title("cosine similarity between positions", fontsize=10)
    ks = np.arange(1, len(sim))
    mean_by_k = np.array([np.diagonal(sim, k).mean() for k in ks])
    ax2.plot(ks, mean_by_k, color="C0")
    for k, v in at.items():
        ax2.plot([k], [v], "o", color="C3")
        ax2.annotate(f"{v:+.3f}", (k, v), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax2.set_xscale("log"), ax2.axhline(0, color="0.5", lw=0.8)
    ax2.set_xlabel("distance k (log scale)"), ax2.set_ylabel("mean cos θ(t, t + k)")
    ax2.set_title("mean similarity by distance", fontsize=10), ax2.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_map(points: list[dict], explained, path, title: str) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 7), dpi=100)
    xs, ys = [p["x"] for p in points], [p["y"] for p in points]
    single = [p["single"] for p in points]
    ax.scatter([x for x, s in zip(xs, single) if s], [y for y, s in zip(ys, single) if s], s=14, color="C0",
               label="one token: its row")
    if not all(single):
        ax.scatter([x for x, s in zip(xs, single) if not s], [y for y, s in zip(ys, single) if not s], s=14,
                   color="C1", label="a word of several tokens: the mean of their rows")
        ax.legend(fontsize=8, loc="best")
    fontsize = 9 if len(points) <= 60 else 7
    for p in points:
        ax.annotate(p["label"], (p["x"], p["y"]), textcoords="offset points", xytext=(3, 3), fontsize=fontsize)
    if explained is not None:
        ax.set_xlabel(f"PC 1 ({100 * explained[0]:.1f}% of variance)")
        ax.set_ylabel(f"PC 2 ({100 * explained[1]:.1f}% of variance)")
    else:
        ax.set_xlabel("t-SNE 1"), ax.set_ylabel("t-SNE 2")
    ax.axhline(0, color="0.85", lw=0.8), ax.axvline(0, color="0.85", lw=0.8)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.2)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_losses(metrics_path: Path, png_path: Path) -> None:
    """loss.png of a run: the training loss, its SMMA and every source's validation loss."""
    plt = pyplot()
    steps, loss, smma, ev = loss_curves(read_metrics(metrics_path))
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(steps, loss, color="0.75", lw=0.8, label="train loss")
    ax.plot(steps, smma, color="C0", lw=1.5, label="smoothed (SMMA)")
    for i, (name, points) in enumerate(ev.items()):
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3, lw=1.2 if name != "all" else 2,
                color="k" if name == "all" else f"C{i + 1}", label=f"val {name}")
    ax.set_xlabel("step"), ax.set_ylabel("cross-entropy (nats/token)"), ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("andrea training")
    fig.tight_layout()
    save_figure(fig, png_path)


def plot_curriculum(history: list[dict], path) -> None:
    """A PNG with three panels over steps: cumulative pulls, rewards, and weights per source."""
    if not history:
        raise AndreaError("the curriculum history is empty; there is nothing to plot.")
    plt = pyplot()
    names = list(history[0]["weights"])
    for h in history:
        if h["source"] not in names:
            names.append(h["source"])
    steps = [h["step"] for h in history]
    fig, (ax_pulls, ax_reward, ax_weight) = plt.subplots(3, 1, sharex=True, figsize=(9, 8), dpi=100)
    for name in names:
        counts, n = [], 0
        for h in history:
            n += h["source"] == name
            counts.append(n)
        line, = ax_pulls.plot(steps, counts, label=name)
        mine = [(h["step"], h["reward"]) for h in history if h["source"] == name]
        ax_reward.plot([s for s, _ in mine], [r for _, r in mine], ".", ms=3, color=line.get_color())
        ax_weight.step(steps, [h["weights"].get(name, 0.0) for h in history], where="post", color=line.get_color())
    ax_pulls.set_ylabel("pulls (cumulative)")
    ax_pulls.legend(loc="upper left", fontsize="small")
    ax_reward.set_ylabel("reward")
    ax_weight.set_ylabel("weight")
    ax_weight.set_ylim(0, 1)
    ax_weight.set_xlabel("step")
    ax_pulls.set_title("curriculum: which source each step drew from")
    fig.tight_layout()
    save_figure(fig, path)
