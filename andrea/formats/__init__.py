"""Model files other than our own checkpoint: ANDREA's `.bin`, a portable JSON model, Hugging Face.

Every reader returns a `Checkpoint` (andrea.checkpoint) plus a list of notes (what layout it found,
what it had to assume), and every writer takes one, so any format converts to any other through
the native form:

    native   one safetensors file written by `save_checkpoint` (or a run folder holding one)
    bin      ANDREA's released checkpoint: step, n, weights, Adam m, Adam v, as little-endian f32
             (formats/bin.py); a folder with a .bin, harris_segments.json and a config JSON too
    json     a portable JSON model for the standard-library engine (formats/portable.py)
    hf       a Hugging Face GPT2LMHeadModel folder (formats/hf.py)

`detect_format` tells them apart by content, never by file name. No reader runs code from a file:
nothing here unpickles.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path

import torch

from andrea.checkpoint import Checkpoint
from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.files import check_regular, read_json

FORMATS = ("native", "bin", "json", "hf")
RELEASE_CONFIG = "config.json"  # the config file of a release folder this package writes
SEGMENTS_FILE = "harris_segments.json"


# ---------------------------------------------------------------- the parameters of a config


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in the model's (and the .bin's) order."""
    return {name: tuple(p.shape) for name, p in _meta_model(cfg).named_parameters()}


def check_weights(cfg: ModelConfig, state: dict, where: str) -> dict[str, torch.Tensor]:
    """state's tensors as float32, in model order, after checking names, shapes and values."""
    shapes = param_shapes(cfg)
    for name in state:
        if name not in shapes:
            raise AndreaError(f"{where} has a weight {name} that the config has no place for.")
    out = {}
    for name, shape in shapes.items():
        if name not in state:
            raise AndreaError(f"{where} has no weight {name}, which the config needs.")
        t = state[name]
        if tuple(t.shape) != shape:
            raise AndreaError(f"{where}: weight {name} has shape {list(t.shape)}, but the config needs {list(shape)}.")
        if not t.is_floating_point():
            raise AndreaError(f"{where}: weight {name} holds {t.dtype} values, not floats.")
        if not torch.isfinite(t).all():
            raise AndreaError(f"{where}: weight {name} holds NaN or infinite values.")
        out[name] = t.float()
    return out


def is_table(name: str) -> bool:
    """The embedding tables: one row per token or position."""
    return name in ("wte.weight", "wpe.weight")


def is_norm(name: str) -> bool:
    return ".ln_" in name or name.startswith("ln_f.")


# ---------------------------------------------------------------- optimizer moments by name


@functools.lru_cache(maxsize=4)
def _meta_model(cfg: ModelConfig):
    """The model of cfg on the meta device: names and shapes, no memory (cached: read-only)."""
    from andrea.model import ANDREA

    with torch.device("meta"):  # shapes and names only, no memory
        return ANDREA(cfg)


def _optimizer_order(cfg: ModelConfig, groups: list) -> list[str]:
    """Parameter names in the index order of an optimizer state with these groups: the order of
    the recipe (`andrea.optim`) whose group sizes they match."""
    from andrea.optim import RECIPES, param_groups

    sizes = [len(g.get("params", [])) for g in groups]
    model = _meta_model(cfg)
    for recipe in RECIPES:
        ours = param_groups(model, recipe)
        if sizes == [len(g["names"]) for g in ours]:
            return [n for g in ours for n in g["names"]]
    described = "; ".join(f"recipe {r} {[len(g['names']) for g in param_groups(model, r)]}" for r in RECIPES)
    raise AndreaError(f"the optimizer state has parameter groups of sizes {sizes}, which match no recipe ({described}).")


def adam_moments(cfg: ModelConfig, optim_state: dict | None) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """{name: (exp_avg, exp_avg_sq)} of an Adam/AdamW state dict; None when there is no state.

    A parameter trained by Muon (recipe v3's block matrices) has a momentum but no Adam moments:
    it gets zeros for both (`muon_trained` names those parameters, so a writer can say so)."""
    if not optim_state or not optim_state.get("state"):
        return None
    shapes = param_shapes(cfg)
    try:
        order = _optimizer_order(cfg, optim_state["param_groups"])
        ids = [i for g in optim_state["param_groups"] for i in g["params"]]
    except (KeyError, TypeError):
        raise AndreaError("the optimizer state has no readable parameter groups.") from None
    out = {}
    for idx, name in zip(ids, order):
        per = optim_state["state"].get(idx, optim_state["state"].get(str(idx)))
        if per is None:  # a parameter that never got a gradient has no state yet
            zero = torch.zeros(shapes[name])
            out[name] = (zero, zero.clone())
            continue
        if "momentum_buffer" in per and "exp_avg" not in per:
            zero = torch.zeros(shapes[name])
            out[name] = (zero, zero.clone())
            continue
        if "exp_avg" not in per or "exp_avg_sq" not in per:
            raise AndreaError(f"the optimizer state of {name} has no exp_avg and exp_avg_sq; only Adam's moments fit a .bin.")
        m, v = per["exp_avg"], per["exp_avg_sq"]
        if tuple(m.shape) != shapes[name] or tuple(v.shape) != shapes[name]:
            raise AndreaError(f"the optimizer state of {name} has shape {list(m.shape)}, but the weight is {list(shapes[name])}.")
        out[name] = (m.float(), v.float())
    return out


def muon_trained(cfg: ModelConfig, optim_state: dict | None) -> list[str]:
    """The parameters whose state is Muon's momentum rather than Adam's moments."""
    if not optim_state or not optim_state.get("state"):
        return []
    order = _optimizer_order(cfg, optim_state["param_groups"])
    ids = [i for g in optim_state["param_groups"] for i in g["params"]]
    state = optim_state["state"]
    return [name for idx, name in zip(ids, order) if "momentum_buffer" in state.get(idx, state.get(str(idx), {}))]


def adam_state(cfg: ModelConfig, step: int, moments: dict, recipe: str) -> dict:
    """An optimizer state dict that the trainer's optimizer for `recipe` loads on resume. Under
    v3 the Muon-trained matrices get no state: their momentum starts from zero, as in a new run."""
    from andrea.optim import check_recipe, make_optimizer

    check_recipe(recipe)
    groups = make_optimizer(_meta_model(cfg), recipe, device="meta").state_dict()["param_groups"]
    ids = [i for g in groups for i in g["params"] if "momentum" not in g]  # Muon's groups have a momentum
    names = [n for g, ours in zip(groups, _groups_names(cfg, recipe)) for n in ours if "momentum" not in g]
    state = {}
    for idx, name in zip(ids, names):
        m, v = moments[name]
        state[idx] = {"step": torch.tensor(float(step), dtype=torch.float32), "exp_avg": m, "exp_avg_sq": v}
    return {"state": state, "param_groups": groups}


def _groups_names(cfg: ModelConfig, recipe: str) -> list[list[str]]:
    from andrea.optim import param_groups

    return [g["names"] for g in param_groups(_meta_model(cfg), recipe)]


def resume_meta(step: int, recipe: str) -> dict:
    """What `andrea train --resume` reads besides weights and optimizer, for a file that lacks it:
    the step and the recipe. The rest of the run's state (the smoothed loss, the data order, the
    curriculum) then starts afresh from the run's seed, as `andrea.train.RunState` documents."""
    return {"step": step, "train": {"recipe": recipe}}


# ---------------------------------------------------------------- tokenizers


def tokenizer_from_segments(segments, where: str) -> dict:
    """The tokenizer dict a checkpoint embeds, from a list of segments in id order."""
    from andrea.tokenizer import HarrisTokenizer

    if not isinstance(segments, list) or not all(isinstance(s, str) for s in segments):
        raise AndreaError(f"{where} is not a JSON list of segment strings.")
    return HarrisTokenizer(segments).to_dict()


def read_segments(path) -> dict:
    """The tokenizer dict of a harris_segments.json file."""
    path = Path(path)
    return tokenizer_from_segments(read_json(path, "segments file"), str(path))


def checked_tokenizer(tok: dict | None, cfg: ModelConfig, where: str) -> dict | None:
    """A tokenizer dict that fits the config's vocabulary (or None)."""
    if tok is None:
        return None
    from andrea.tokenizer import HarrisTokenizer

    t = HarrisTokenizer.from_dict(tok, where)
    if t.vocab_size != cfg.vocab_size:
        raise AndreaError(f"{where} has {t.n_segments:,} segments (V = {t.vocab_size:,}) but the model has V = {cfg.vocab_size:,}.")
    return t.to_dict()


# ---------------------------------------------------------------- which format a path holds


def detect_format(path) -> str:
    """'native', 'bin', 'json' or 'hf', from the path's content (never its name)."""
    path = Path(path)
    if path.is_dir():
        return _detect_folder(path)
    check_regular(path, "the model file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(64)
    # a .bin first: its step could start with any byte, even "{"; its size pins it down exactly
    if size >= 8:
        n = struct.unpack("<i", head[4:8])[0]
        if n > 0 and size == 8 + 12 * n:
            return "bin"
    stripped = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    if stripped.startswith((b"{", b"[")):
        return "json"
    if size >= 9:
        header_len = struct.unpack("<Q", head[:8])[0]
        if 8 + header_len <= size and head[8:9] == b"{":
            return "native"
    found = f"its header says n_params = {struct.unpack('<i', head[4:8])[0]:,}" if size >= 8 else "it is shorter than 8 bytes"
    raise AndreaError(f"{path} is not a model file andrea reads: not JSON, not safetensors, and not an ANDREA .bin "
                      f"of 8 + 12·n bytes ({size:,} bytes, and {found}).")


def _detect_folder(path: Path) -> str:
    if (path / "best.safetensors").exists() or (path / "latest.safetensors").exists():
        return "native"
    bins = sorted(path.glob("*.bin"))
    if (path / "config.json").exists() and not [b for b in bins if b.name != "pytorch_model.bin"]:
        return "hf"
    if bins:
        return "bin"
    raise AndreaError(f"{path} is a folder but holds no model: expected a run folder (latest.safetensors), a Hugging "
                      f"Face folder (config.json and model.safetensors) or an ANDREA release (a .bin, {SEGMENTS_FILE} "
                      f"and a config JSON).")


# ---------------------------------------------------------------- reading and writing any format


def read_native(path) -> tuple[Checkpoint, list[str]]:
    from andrea.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    ckpt.model_state = check_weights(ckpt.config, ckpt.model_state, str(path))
    if ckpt.tokenizer_dict is not None:
        ckpt.meta["tokenizer"] = checked_tokenizer(ckpt.tokenizer_dict, ckpt.config, f"the tokenizer of {path}")
    return ckpt, []


def read_model(path, fmt: str | None = None, config: ModelConfig | None = None, segments=None,
               orientation: str = "auto", recipe: str = "v1") -> tuple[Checkpoint, str, list[str]]:
    """(checkpoint, format, notes) of any model file or folder.

    config and segments (a harris_segments.json path) are what a bare .bin lacks; a config
    given for another format must equal the file's own. orientation and recipe apply to .bin.
    """
    fmt = fmt or detect_format(path)
    if fmt == "bin":
        from andrea.formats.bin import read_bin_or_release

        ckpt, notes = read_bin_or_release(path, config, segments, orientation, recipe)
    else:
        if fmt == "native":
            ckpt, notes = read_native(path)
        elif fmt == "json":
            from andrea.formats.portable import read_json

            ckpt, notes = read_json(path)
        elif fmt == "hf":
            from andrea.formats.hf import read_hf

            ckpt, notes = read_hf(path)
        else:
            raise AndreaError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}.")
        if config is not None and config != ckpt.config:
            raise AndreaError(f"{path} holds its own config ({ckpt.config.to_dict()}), which differs from the one given; "
                              f"drop --config/--preset for this file.")
        if segments is not None:
            ckpt.meta["tokenizer"] = checked_tokenizer(read_segments(segments), ckpt.config, str(segments))
    return ckpt, fmt, notes


def write_model(ckpt: Checkpoint, path, fmt: str) -> list[str]:
    """Write ckpt to path in format fmt; notes say what the format could not hold."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "native":
        from andrea.checkpoint import save_checkpoint

        # what load_checkpoint adds to meta is written back by save_checkpoint in its own place
        meta = {k: v for k, v in ckpt.meta.items() if k not in ("rng_torch", "optimizer", "format", "version", "config")}
        save_checkpoint(path, ckpt.config, ckpt.model_state, ckpt.optim_state, meta)
        return []
    if fmt == "bin":
        from andrea.formats.bin import write_bin_or_release

        return write_bin_or_release(path, ckpt)
    if fmt == "json":
        from andrea.formats.portable import write_json

        return write_json(path, ckpt)
    if fmt == "hf":
        from andrea.formats.hf import write_hf

        return write_hf(path, ckpt)
    raise AndreaError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}.")


def convert(src, dst, to: str, config: ModelConfig | None = None, segments=None, orientation: str = "auto",
            recipe: str = "v1") -> tuple[str, list[str]]:
    """Read src in whatever format it holds and write it to dst as `to`; (source format, notes)."""
    if to not in FORMATS:
        raise AndreaError(f"unknown target format {to!r}; known: {', '.join(FORMATS)}.")
    if Path(src).resolve() == Path(dst).resolve():
        raise AndreaError(f"{dst} is the source itself; write the converted model somewhere else.")
    ckpt, fmt, notes = read_model(src, None, config, segments, orientation, recipe)
    return fmt, notes + write_model(ckpt, dst, to)
