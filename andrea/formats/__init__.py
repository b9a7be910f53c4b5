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

import struct
from pathlib import Path

from andrea.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.files import check_regular
from andrea.formats.bin import read_bin_or_release, write_bin_or_release
from andrea.formats.common import (  # noqa: F401  (the formats' shared names, importable from here)
    RELEASE_CONFIG,
    SEGMENTS_FILE,
    adam_moments,
    adam_state,
    check_weights,
    checked_tokenizer,
    is_norm,
    is_table,
    muon_trained,
    param_shapes,
    read_segments,
    resume_meta,
    tokenizer_from_segments,
)
from andrea.formats.hf import read_hf, write_hf
from andrea.formats.portable import read_json, write_json

FORMATS = ("native", "bin", "json", "hf")

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

        ckpt, notes = read_bin_or_release(path, config, segments, orientation, recipe)
    else:
        if fmt == "native":
            ckpt, notes = read_native(path)
        elif fmt == "json":

            ckpt, notes = read_json(path)
        elif fmt == "hf":

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

        # what load_checkpoint adds to meta is written back by save_checkpoint in its own place
        meta = {k: v for k, v in ckpt.meta.items() if k not in ("rng_torch", "optimizer", "format", "version", "config")}
        save_checkpoint(path, ckpt.config, ckpt.model_state, ckpt.optim_state, meta)
        return []
    if fmt == "bin":

        return write_bin_or_release(path, ckpt)
    if fmt == "json":

        return write_json(path, ckpt)
    if fmt == "hf":

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
