"""Helpers the benchmark scripts share: the machine line, markdown tables, the main job's data."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def today() -> str:
    return datetime.date.today().isoformat()


def machine_line(torch_version: str | None = None) -> str:
    """CPU model, cores, torch and python versions, the 1-minute load average and today's date."""
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    return (f"{cpu_name()}, {os.cpu_count()} cores, torch {torch_version}, python {platform.python_version()}; "
            f"load average {load_average()}; {today()}")


def md_table(headers: list[str], rows: list[list], right: set[int] | None = None) -> str:
    """A markdown table; columns whose index is in `right` are right-aligned (default: all but the first)."""
    right = set(range(1, len(headers))) if right is None else right
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def md_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table in `text`, as (header cells, body rows of cells)."""
    tables, block = [], []
    for line in text.splitlines() + [""]:
        if line.strip().startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(block) >= 2 and all(re.fullmatch(r":?-+:?", c) for c in block[1]):
            tables.append((block[0], block[2:]))
        block = []
    return tables


def shift_headings(text: str, top: int) -> str:
    """Move the markdown headings of `text` (outside code fences) so the highest becomes level `top`."""
    lines, fenced, levels = text.splitlines(), False, []
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#{1,6}) ", line)):
            levels.append(len(m.group(1)))
    if not levels:
        return text
    shift, fenced, out = top - min(levels), False, []
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#{1,6}) ", line)):
            line = "#" * min(6, len(m.group(1)) + shift) + line[len(m.group(1)):]
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def say(*args) -> None:
    """Progress for the person watching, on stderr: stdout carries only the report."""
    print(*args, file=sys.stderr, flush=True)


def main_job_data(n_segments: int, log=say) -> Path:
    """The main job's token shards (`andrea.mainjob.main_job_data`; cached after one run)."""
    from andrea.mainjob import main_job_data as stages

    return stages(n_segments, log)[3]


def fit_bpe(texts, vocab: int):
    """A byte-level BPE of `tokenizers` fitted on texts with `vocab` ids, <BOS> among them: the peer
    of the Harris tokenizer in the tokenizer benchmarks."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<BOS>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    return bpe


RESULT_FILE = "bench_result.json"  # a finished run's figures, so that a later call with the same --out reuses them


def read_result(run: Path, plan: dict) -> dict | None:
    """The figures of a run measured earlier under the same plan (settings, budget, threads), or None."""
    try:
        got = json.loads((run / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(got, dict) or any(got.get(k) != v for k, v in plan.items()):
        return None
    return got


def stopped_by_signal(script: str, result, what: str, kept: bool) -> bool:
    """True, after one sentence on stderr, when a signal stopped a run that `train` returned (the
    script then writes no figures for it and exits); `kept`: the finished runs stay (an --out)."""
    if result.stopped != "signal":
        return False
    again = (" a later call with the same --out keeps the finished runs and trains that one anew" if kept
             else " nothing was kept (no --out)")
    print(f"{script}: stopped by a signal during {what};{again}.", file=sys.stderr)
    return True


def write_result(run: Path, plan: dict, figures: dict) -> None:
    """Leave a finished run's figures, with the plan they were measured under, for read_result."""
    (run / RESULT_FILE).write_text(json.dumps({**plan, **figures}) + "\n")
