"""The TensorFlow Embedding Projector's two files (projector.tensorflow.org, "Load"):

    vectors.tsv    one row per token, its d values tab-separated (%.6g)
    metadata.tsv   a header `piece<TAB>id<TAB>kind`, then one line per token: the piece as one
                   visible line (spaces as ␣), its id, and byte, BOS or segment

Each file is written atomically, so a full disk leaves the old file or none, never half of one,
and the error names the file.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from andrea.errors import AndreaError
from andrea.files import atomic_write_bytes, write_error_reason
from andrea.inside.embed import show_piece, token_kind
from andrea.inside.vectors import table


def write_projector(out_dir, model, tokenizer, which: str = "input") -> tuple[Path, Path]:
    """vectors.tsv and metadata.tsv of one table (input or output) in out_dir."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AndreaError(f"cannot write to {out} ({write_error_reason(e)}).") from None
    m = table(model, which)
    vectors, meta = out / "vectors.tsv", out / "metadata.tsv"
    buf = io.StringIO()
    np.savetxt(buf, m, delimiter="\t", fmt="%.6g")
    atomic_write_bytes(vectors, buf.getvalue().encode())
    lines = ["piece\tid\tkind"] + [f"{show_piece(tokenizer.id_to_piece(i))}\t{i}\t{token_kind(i)}" for i in range(len(m))]
    atomic_write_bytes(meta, ("\n".join(lines) + "\n").encode("utf-8"))
    return vectors, meta
