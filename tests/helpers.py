"""What several test modules share: synthetic text, tiny models and run settings, and the check
that a command ended in one sentence. Fixtures live in conftest.py; this module holds plain
functions, imported by name (`from helpers import cli`)."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from andrea.cli import main
from andrea.config import ModelConfig
from andrea.model import ANDREA
from andrea.shards import HEADER, TokenData, write_shard
from andrea.trainconfig import TrainConfig

WORDS = ("the cat sat on a mat and the dog ran to its pet owner while kings and queens "
         "talked of unbelievable things rethinking old ideas quickly").split()
SET_WORDS = ["cat", "dog", "pet", "mat", "kings", "queens", "owner", "ideas"]  # the `wordsets` fixture's pairs


def synthetic_text(seed: int, n_docs: int, words_per_doc: int = 400) -> list[str]:
    """Documents of sentences drawn from WORDS, seeded."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        sentences, n = [], 0
        while n < words_per_doc:
            k = rng.randint(4, 12)
            sentences.append(" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + ".")
            n += k
        docs.append(" ".join(sentences))
    return docs


def tiny_config(data_dir: Path, **changes) -> ModelConfig:
    """A 2-layer, d = 32 model for a data folder's vocabulary."""
    V = TokenData(data_dir).vocab_size
    return ModelConfig(**{**dict(vocab_size=V, n_embd=32, n_head=2, n_layer=2, block_size=32), **changes})


def opts(**changes) -> TrainConfig:
    """Settings of a tiny run: 8 steps of 4 × 32 tokens, evaluated and saved every 4."""
    base = dict(batch_size=4, micro_batch=2, seq_len=32, max_steps=8, eval_every=4, checkpoint_every=4,
                warmup_steps=2, eval_windows=2, seed=7)
    base.update(changes)
    return TrainConfig(**base)


def quiet(*args, **kwargs):
    """A log that keeps nothing."""


def unit_model(block_size=64, vocab_size=300, seed=0, n_embd=32, n_head=4, **changes) -> ANDREA:
    """A 2-layer model with unit-scale random weights: attention and logits far from uniform, so
    the tokens it picks depend on the context it sees."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, n_embd=n_embd, n_head=n_head, n_layer=2, block_size=block_size, **changes)
    model = ANDREA(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))
    return model


def cli(capsys, *args) -> tuple[int, str, str]:
    """Run the command in this process: (exit status, stdout, stderr); never a traceback."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    return code, out, err


def one_sentence(code: int, err: str) -> str:
    """The one line `andrea: error: ...` a refused command prints, with exit status 2."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("andrea: error: "), err
    return lines[0]


RUN_WORDS = "the king and queen sat on a mat while dogs ran to their owners talking of old things".split()
"""The words of the hostile-input runs' text."""


def documents(seed: int, n: int, words: int = 300) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(RUN_WORDS) for _ in range(words)).capitalize() + "." for _ in range(n)]


def text_train_args(text_data, text_model_json, out, *extra, steps=4):
    return ["train", "--data", str(text_data), "--out", str(out), "--model-config", str(text_model_json),
            "--max-steps", str(steps), "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "2",
            "--checkpoint-every", "2", "--eval-every", "2", "--eval-windows", "1", "--no-audit", "--no-progress", *extra]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every checkpoint of a folder, byte for byte."""
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.safetensors"))}


def copy_text_run(text_run: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("latest.safetensors", "best.safetensors", "metrics.jsonl"):
        (dst / name).write_bytes((text_run / name).read_bytes())
    return dst


def rewrite(path: Path, tensors=None, meta=None, dst: Path | None = None) -> Path:
    """Write path's checkpoint again (to dst, or in place) after tensors(dict) and meta(dict)
    have changed what they like."""
    with safe_open(str(path), framework="pt") as f:
        ts = {k: f.get_tensor(k) for k in f.keys()}
        m = json.loads(f.metadata()["andrea"])
    if tensors is not None:
        tensors(ts)
    if meta is not None:
        meta(m)
    dst = dst or path
    save_file(ts, str(dst), metadata={"andrea": json.dumps(m)})
    return dst


def _shape(t: torch.Tensor) -> torch.Tensor:
    return t.flatten()[:-1].clone() if t.numel() > 1 else torch.zeros(2, dtype=t.dtype)


def _dtype(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int32) if t.is_floating_point() else t.to(torch.float32)


def _nan(t: torch.Tensor) -> torch.Tensor:
    if not t.is_floating_point():  # the generator state: bytes torch's generator does not accept
        return torch.full_like(t, 255)
    t = t.clone()
    t.view(-1)[t.numel() // 2] = float("nan")
    return t


TENSOR_DAMAGE = {"shape": _shape, "dtype": _dtype, "nan": _nan, "missing": None}


ABSURD = ["x", [], None, -1, 10**30, float("nan")]


def tensor_cases(path: Path) -> list:
    with safe_open(str(path), framework="pt") as f:
        names = list(f.keys())
    cases = []
    for name in names:
        for kind, damage in TENSOR_DAMAGE.items():
            def change(ts, name=name, damage=damage):
                if damage is None:
                    del ts[name]
                else:
                    ts[name] = damage(ts[name])
            cases.append((f"{name} {kind}", change, None))
    for extra in ("model.h.9.mlp.fc1.weight", "optim.99.exp_avg", "junk"):
        cases.append((f"extra {extra}", lambda ts, extra=extra: ts.__setitem__(extra, torch.zeros(3)), None))
    return cases


def meta_cases(path: Path) -> list:
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["andrea"])
    cases = []
    for key in meta:
        cases.append((f"meta {key} missing", None, lambda m, key=key: m.pop(key)))
        for value in ABSURD:
            cases.append((f"meta {key} = {value!r}", None, lambda m, key=key, value=value: m.__setitem__(key, value)))
    for key in meta["config"]:
        for value in (10**9, 10**6, 0, -1, "x", 2.5):
            cases.append((f"config {key} = {value!r}", None, lambda m, key=key, value=value: m["config"].__setitem__(key, value)))
    cases.append(("config vocab 10^9 and 10^6 layers", None, lambda m: m["config"].update(vocab_size=10**9, n_layer=10**6)))
    cases.append(("config rope at 10^9 positions", None, lambda m: m["config"].update(pos="rope", block_size=10**9)))
    for key, value in (("param_groups", "x"), ("param_groups", [{"params": ["a"]}]), ("param_groups", []),
                       ("param_groups", [{"params": list(range(15))}]), ("scalars", {"0.step": "x"})):
        cases.append((f"optimizer {key} = {value!r}", None,
                      lambda m, key=key, value=value: m["optimizer"].__setitem__(key, value)))
    cases.append(("optimizer groups swapped", None, lambda m: m["optimizer"]["param_groups"].reverse()))
    for key, value in (("smma", {"window": 0, "n": 1, "value": 1.0}), ("data_rng", {"state": "x"}),
                       ("train", {"recipe": "v1"}), ("tokenizer", {"format": "x"})):
        cases.append((f"meta {key} = {value!r}", None, lambda m, key=key, value=value: m.__setitem__(key, value)))
    return cases


def file_values(path: Path) -> int:
    """Model values the file really holds: the bound on any model a command may build from it."""
    with safe_open(str(path), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith("model."))


def damaged_data(text_data: Path, tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / "data"
    shutil.copytree(text_data, dst)
    return dst


SECRET = b"root:x:0:0:secret-bytes"


ROOT = Path(__file__).resolve().parent.parent


def short_documents(seed: int, n: int, words: int = 200) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(RUN_WORDS) for _ in range(words)).capitalize() + "." for _ in range(n)]


def run_cli(*args, timeout=120, stdin=None, env=None) -> subprocess.CompletedProcess:
    """The command in a fresh process."""
    return subprocess.run([sys.executable, "-m", "andrea", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=stdin, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def process_sentence(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return one_sentence(done.returncode, done.stderr)


def peak_rss(args: list, timeout=300, stdin=None) -> tuple[subprocess.CompletedProcess, int]:
    """Run `python -m andrea ARGS` under /usr/bin/time -v: (the process, its peak RSS in bytes)."""
    import tempfile

    with tempfile.NamedTemporaryFile("r") as report:
        done = subprocess.run(["/usr/bin/time", "-v", "-o", report.name, sys.executable, "-m", "andrea", *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, stdin=stdin,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        line = next(x for x in open(report.name).read().splitlines() if "Maximum resident set size" in x)
    return done, int(line.split(":")[1]) * 1024


def audited_train_args(two_source_data, two_source_model_json, out, *extra, steps=4):
    return ["train", "--data", two_source_data, "--out", out, "--model-config", two_source_model_json, "--max-steps", steps,
            "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "2", "--checkpoint-every", "2", "--eval-every", "2",
            "--eval-windows", "1", "--audit", "--audit-every", "2", "--audit-tokens", "8", "--no-progress", *extra]


def read_meta(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["andrea"])


def damaged_copy(audited_run: Path, dst: Path, change) -> Path:
    """The run folder copied to dst, its latest checkpoint's metadata changed by change(meta)."""
    dst.mkdir(parents=True)
    for name in ("best.safetensors", "metrics.jsonl"):
        (dst / name).write_bytes((audited_run / name).read_bytes())
    with safe_open(str(audited_run / "latest.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = json.loads(f.metadata()["andrea"])
    change(meta)
    save_file(tensors, str(dst / "latest.safetensors"), metadata={"andrea": json.dumps(meta)})
    return dst


def _set(section, key, value):
    def change(m):
        m[section][key] = value(m[section][key]) if callable(value) else value
    return change


def _history_source(m):
    m["curriculum"]["history"][0][1] = 99


def _history_entry(m):
    m["curriculum"]["history"][0] = [0, 0, "x", 0.0, 0]


def _rng(m):
    m["curriculum"]["rng"][1][3] = 2**40


RUN_STATE_DAMAGE = {
    "curriculum weights NaN": (_set("curriculum", "weights", lambda w: [math.nan] * len(w)), "weights"),
    "curriculum weights too short": (_set("curriculum", "weights", lambda w: w[:1]), "weights"),
    "curriculum weights Infinity": (_set("curriculum", "weights", lambda w: [math.inf] * len(w)), "weights"),
    "curriculum pulls negative": (_set("curriculum", "pulls", lambda p: [-1] * len(p)), "pulls"),
    "curriculum pulls not the history's": (_set("curriculum", "pulls", lambda p: [x + 1 for x in p]), "pulls"),
    "curriculum pulls Infinity": (_set("curriculum", "pulls", lambda p: [math.inf] * len(p)), "pulls"),
    "curriculum ema Infinity": (_set("curriculum", "ema", lambda e: [math.inf] * len(e)), "ema"),
    "curriculum ema one too many": (_set("curriculum", "ema", lambda e: e + [1.0]), "ema"),
    "curriculum reward_sum NaN": (_set("curriculum", "reward_sum", lambda e: [math.nan] * len(e)), "reward_sum"),
    "curriculum history names source 99": (_history_source, "history"),
    "curriculum history entry damaged": (_history_entry, "history"),
    "curriculum history far longer than the run": (_set("curriculum", "history", lambda h: h * 50), "history"),
    "curriculum step Infinity": (_set("curriculum", "step", math.inf), "step"),
    "curriculum step beyond the run": (_set("curriculum", "step", 10**6), "step"),
    "curriculum next_reroll negative": (_set("curriculum", "next_reroll", -5), "next_reroll"),
    "curriculum open names an unknown source": (_set("curriculum", "open", ["nowhere"]), "open"),
    "curriculum rng word too large": (_rng, "rng"),
    "curriculum rng a string": (_set("curriculum", "rng", "x"), "rng"),
    "curriculum rerolls damaged": (_set("curriculum", "rerolls", [[0, [math.nan, 0.5]]]), "rerolls"),
    "curriculum recent NaN": (_set("curriculum", "recent", lambda r: [math.nan] * len(r)), "recent"),
    "curriculum a list": (lambda m: m.__setitem__("curriculum", [1, 2]), "curriculum"),
    "audit scores Infinity": (_set("audit", "scores", lambda s: [math.inf] * len(s)), "scores"),
    "audit scores beyond 100": (_set("audit", "scores", lambda s: [1e9] * len(s)), "scores"),
    "audit streak negative": (_set("audit", "streak", -3), "streak"),
    "audit streak longer than the scores": (_set("audit", "streak", 10**6), "streak"),
    "audit streak Infinity": (_set("audit", "streak", math.inf), "streak"),
}


LONG_INT = "9" * 5000


DEEP = "[" * 100_000 + "]" * 100_000


def big_config(two_source_data: Path, path: Path, **changes) -> Path:
    cfg = {"vocab_size": TokenData(two_source_data).vocab_size, "n_embd": 32, "n_head": 2, "n_layer": 1, "block_size": 32}
    path.write_text(json.dumps({**cfg, **changes}))
    return path


def prose(seed: int, n_bytes: int) -> str:
    """Sentences of RUN_WORDS, with the characters a JSON writer escapes (quotes, backslashes, new
    lines, tabs), letters beyond ASCII and beyond the BMP, until n_bytes."""
    rng = random.Random(seed)
    extra = ['"so"', "back\\slash", "naïve", "😀", "tab\there", "new\nline", "Ünïcödé", "a\u3000b"]
    parts, n = [], 0
    while n < n_bytes:
        s = " ".join(rng.choice(RUN_WORDS + extra) for _ in range(30)).capitalize() + ".\n"
        parts.append(s)
        n += len(s)
    return "".join(parts)


def need_time():
    if not os.access("/usr/bin/time", os.X_OK):
        pytest.skip("/usr/bin/time is not installed (apt-get install time); peak memory is measured with it")


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def root_train_args(prepared_root: Path, out, *extra, data=None, steps=4):
    return ["train", "--data", str(data or prepared_root / "data"), "--out", str(out), "--model-config", str(prepared_root / "model.json"),
            "--max-steps", str(steps), "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "2",
            "--checkpoint-every", "2", "--eval-every", "2", "--eval-windows", "1", "--no-audit", "--no-progress", *extra]


def run_andrea(*args, timeout=120, env=None, **kw) -> subprocess.CompletedProcess:
    """`python -m andrea ARGS` in a fresh process; a reader that blocks runs into the timeout."""
    return subprocess.run([sys.executable, "-m", "andrea", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env or ENV, **kw)


def last_sentence(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def temp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name or p.name.endswith(".partial")]


@contextmanager
def released_after(fifos, seconds: float = 20.0):
    """While the block runs, a watchdog that, after `seconds`, opens each FIFO for writing and
    closes it again: a reader blocked on one then reads its end, so a regression fails the test
    instead of hanging it."""
    done = threading.Event()

    def release():
        if done.wait(seconds):
            return
        while not done.is_set():
            for fifo in fifos:
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass  # no reader has it open (yet)
            time.sleep(0.05)

    watchdog = threading.Thread(target=release, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()


def _text(n_words: int, seed: int = 0) -> bytes:
    """Text that compresses into many zstd blocks (random short words)."""
    rng = random.Random(seed)
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 8))) for _ in range(n_words)).encode()


def fetched_cache(cache: Path, name: str = "sotu") -> Path:
    """A fetched source's cache folder as `corpus.fetch_source` lays it out (record, two splits)."""
    folder = cache / "corpus" / name
    folder.mkdir(parents=True)
    docs = [" ".join(documents(10 + i, 1, 40)) for i in range(40)]
    splits = {"train": [d for i, d in enumerate(docs) if i % 20 != 10], "val": [d for i, d in enumerate(docs) if i % 20 == 10]}
    meta = {"name": name, "description": "x", "package": "p", "sha256": "0" * 64, "licence": "public domain", "documents": 40}
    for split, items in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in items))
        meta[f"{split}_documents"] = len(items)
        meta[f"{split}_bytes"] = sum(len(d) for d in items)
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def copy_root_run(root_run: Path, dst: Path) -> Path:
    shutil.copytree(root_run, dst)
    return dst


def lock_holder(folder: Path) -> str:
    try:
        return (folder / ".lock").read_text().strip()
    except OSError:
        return ""


def metric_rows(folder: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.endswith("}")]
    except OSError:
        return []


def shard_tokens(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<u2", offset=HEADER.size).copy()


def swap_two_ids(shard: Path) -> None:
    """Rewrite a shard with two different ids swapped: a whole shard, every id below V, other bytes."""
    tokens = shard_tokens(shard)
    i = int(np.flatnonzero(tokens != tokens[1])[1])
    tokens[[1, i]] = tokens[[i, 1]]
    write_shard(shard, tokens)


def raw_get_at(address: str, port: int, host: str) -> int:
    """The status of one GET /api/info sent to address with the given Host header."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect((address, port))
        s.sendall(f"GET /api/info HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split()[1])


# ---------------------------------------------------------------- text for the tokenizer's tests

STEMS = ["work", "play", "read", "help", "paint", "walk", "talk", "teach", "kind", "mark", "fill", "load",
         "lock", "pack", "print", "view", "turn", "count", "cover", "form"]
PREFIXES = ["", "", "", "un", "re", "pre", "dis", "over"]
SUFFIXES = ["", "", "s", "ed", "ing", "er", "able", "ness", "ment", "ly", "est"]
SMALL_WORDS = ["the", "of", "and", "a", "to", "in", "is", "was", "café", "naïve", "I", "it"]


def morphology_text(n_paragraphs=250, seed=0) -> str:
    """Sentences of prefix+stem+suffix words and small words (about 110 KB): a corpus whose
    morpheme boundaries are known."""
    rng = random.Random(seed)
    paragraphs = []
    for _ in range(n_paragraphs):
        sentences = []
        for _ in range(8):
            words = [rng.choice(SMALL_WORDS) if rng.random() < 0.4
                     else rng.choice(PREFIXES) + rng.choice(STEMS) + rng.choice(SUFFIXES)
                     for _ in range(rng.randint(4, 12))]
            s = " ".join(words)
            sentences.append(s[0].upper() + s[1:] + rng.choice(".,!?;."))
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)


N_SMALL = 300


DASH_WORDS = "the cat sat on a mat while dog ran over hill and pet slept near door because rain fell softly".split()


def dash_docs(n_docs=300, seed=0) -> list[str]:
    """Sentences of a few words where an em-dash often stands for "and" and a curly apostrophe
    often joins the first two words: text whose one-character segments of 3 bytes matter."""
    rng = random.Random(seed)

    def sentence():
        text = " ".join(rng.choices(DASH_WORDS, k=rng.randint(5, 12)))
        if rng.random() < 0.6:
            text = text.replace(" and ", " — ", 1)
        if rng.random() < 0.5:
            text = "\u2019".join(text.split(" ", 1))
        return text.capitalize() + "."

    return [" ".join(sentence() for _ in range(30)) for _ in range(n_docs)]


# ---------------------------------------------------------------- text for preparing shards

PREP_WORDS = ("the king of old spoke to his people and they went up to the city while the sea rose over "
              "land where ships sailed far away in storms of night and day café naïve").split()


def prep_doc(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(PREP_WORDS) for _ in range(n)).capitalize() + "."


def prep_docs(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [prep_doc(rng, rng.randint(5, 300)) for _ in range(n)]


def prep_tokenizer():
    """30 segments fitted on 30 documents of 400 words: the tokenizer the shard tests encode with."""
    from andrea.tokenizer.train import train_tokenizer

    rng = random.Random(0)
    return train_tokenizer([prep_doc(rng, 400) for _ in range(30)], 30)


def split_tokens(data: Path, name: str, split: str) -> np.ndarray:
    """One split of one source of a data folder, all its shards read as one array."""
    return np.asarray(getattr(TokenData(data).sources[name], split)[:])


def python_only(segments):
    """A Harris tokenizer that encodes with the Python steps, as where andrea.tokenizer._harris was not built."""
    import andrea.tokenizer.harris as harris

    saved, harris._compiled = harris._compiled, None
    try:
        return harris.HarrisTokenizer(segments)
    finally:
        harris._compiled = saved


def kind_patterns(n: int) -> np.ndarray:
    """(1, 1, 4, 2n + 1, 2n + 1): head 1 previous token, 2 first token, 3 same token, 4 induction,
    each query all its weight on its kind's key where it has one (the first token otherwise)."""
    T = 2 * n + 1
    p = np.zeros((1, 1, 4, T, T))
    p[..., 0] = 1.0
    for i in range(1, T):
        p[0, 0, :, i, 0] = 1.0
        wanted = {0: i - 1, 2: i - n if i > n else None, 3: i - n + 1 if i > n else None}
        for head, j in wanted.items():
            if j is not None and 0 <= j <= i:
                p[0, 0, head, i, :] = 0
                p[0, 0, head, i, j] = 1.0
    return p
