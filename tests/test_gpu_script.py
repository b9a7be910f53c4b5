"""benchmarks/gpu.sh --dry-run: the GPU benchmark's every part, end to end, at tiny sizes on the CPU.

A session lent a GPU has minutes of device time for one prepared run of gpu.sh; this is what keeps
the script from breaking between such sessions without anyone noticing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import synthetic_text

from andrea.prepare import prepare
from andrea.tokenizer.train import train_tokenizer

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_script_dry_run_measures_every_part(tmp_path):
    for name, seed in (("alpha", 1), ("beta", 2)):
        (tmp_path / f"{name}.txt").write_text("\n\n".join(synthetic_text(seed, 30)))
    tok = train_tokenizer(synthetic_text(3, 20), 40)
    prepare(tok, [str(tmp_path / "alpha.txt"), str(tmp_path / "beta.txt")], tmp_path / "data", log=lambda *a: None)
    env = dict(os.environ, PYTHON=sys.executable, ANDREA_DATA=str(tmp_path / "data"),
               ANDREA_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--dry-run"], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert out.startswith("## GPU: andrea-tiny (dry run) training and decode")
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    for word in ("failed", "timed out", "skipped", "ended without a result", "unmeasured"):
        assert not [r for r in rows if word in r], (word, out)
    train = [r for r in rows if r.startswith(("| andrea |", "| gpt2 |", "| andrea-whole-loss |"))]
    assert len(train) == 7 and sum("torch.compile" in r for r in train) == 2  # 2 eager pairs + whole loss, 1 compiled pair
    decode = [r for r in rows if "bf16 | 16 + 16" in r]
    assert len(decode) == 4 and all(r.rstrip().endswith("| all |") for r in decode)  # every decoder: the same tokens
    assert [r for r in rows if r.startswith("| andrea train |") and "3 steps" in r and "data" in r]
    assert [r for r in rows if r.startswith("| andrea generate |") and "wall" in r]
    assert "Whole script:" in out
