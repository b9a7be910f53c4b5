"""Every promise on every path, for what enters andrea: the run state a checkpoint brings back,
Python's own JSON limits, sizes claimed by a config or a flag, and one huge or hostile document.

Each case is a real file or a real process; each ends in work done or in one sentence and exit 2."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cli, one_sentence
from safetensors import safe_open
from safetensors.torch import save_file

from andrea.cli import main
from andrea.config import ModelConfig
from andrea.data import TokenData, prepare
from andrea.errors import AndreaError
from andrea.tokenizer import HarrisTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the king and queen sat on a mat while dogs ran to their owners talking of old things".split()
ROOT = Path(__file__).resolve().parent.parent


def documents(seed: int, n: int, words: int = 200) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "." for _ in range(n)]




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


# ---------------------------------------------------------------- a real run with a curriculum and an audit


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("harden")
    (root / "north.txt").write_text("\n\n".join(documents(1, 40)))
    (root / "south.txt").write_text("\n\n".join(documents(3, 40)))
    tok = HarrisTokenizer.train(documents(2, 30), 20)
    prepare(tok, [str(root / "north.txt"), str(root / "south.txt")], root / "data", log=lambda *a: None, progress=False)
    return root / "data"


@pytest.fixture(scope="module")
def model_json(data_dir) -> Path:
    path = data_dir.parent / "model.json"
    ModelConfig(vocab_size=TokenData(data_dir).vocab_size, n_embd=32, n_head=2, n_layer=1, block_size=32).save(path)
    return path


def train_args(data_dir, model_json, out, *extra, steps=4):
    return ["train", "--data", data_dir, "--out", out, "--model-config", model_json, "--max-steps", steps,
            "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "2", "--checkpoint-every", "2", "--eval-every", "2",
            "--eval-windows", "1", "--audit", "--audit-every", "2", "--audit-tokens", "8", "--no-progress", *extra]


@pytest.fixture(scope="module")
def run_dir(data_dir, model_json, tmp_path_factory) -> Path:
    """A healthy run of 4 steps over two sources: its checkpoints hold a curriculum and an audit."""
    out = tmp_path_factory.mktemp("run") / "r"
    assert main([str(a) for a in train_args(data_dir, model_json, out)]) in (0, 3)
    meta = read_meta(out / "latest.safetensors")
    assert meta["curriculum"]["history"] and meta["audit"]["scores"]
    return out


def read_meta(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["andrea"])


def damaged_copy(run_dir: Path, dst: Path, change) -> Path:
    """The run folder copied to dst, its latest checkpoint's metadata changed by change(meta)."""
    dst.mkdir(parents=True)
    for name in ("best.safetensors", "metrics.jsonl"):
        (dst / name).write_bytes((run_dir / name).read_bytes())
    with safe_open(str(run_dir / "latest.safetensors"), framework="pt") as f:
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


@pytest.mark.parametrize("case", list(RUN_STATE_DAMAGE))
def test_damaged_run_state_is_refused_before_work_starts(data_dir, model_json, run_dir, tmp_path, capsys, case):
    """Each field of the curriculum's and the audit's saved state, damaged (wrong type, out of range,
    not finite, of the wrong length, against the run's sources): `train --resume` ends in one
    sentence that names the checkpoint and the field, exit 2, before a step, and the checkpoint is
    left as it was."""
    change, field = RUN_STATE_DAMAGE[case]
    out = damaged_copy(run_dir, tmp_path / "r", change)
    before = (out / "latest.safetensors").read_bytes()
    code, _, err = cli(capsys, *train_args(data_dir, model_json, out, "--resume", steps=8))
    line = one_sentence(code, err)
    assert str(out / "latest.safetensors") in line and repr(field) in line, line
    assert (out / "latest.safetensors").read_bytes() == before
    assert "step 5" not in (out / "metrics.jsonl").read_text()


def test_an_intact_run_state_resumes(data_dir, model_json, run_dir, tmp_path, capsys):
    """The checks refuse no state a run wrote: the copy resumes to its end."""
    out = damaged_copy(run_dir, tmp_path / "r", lambda m: None)
    code, _, err = cli(capsys, *train_args(data_dir, model_json, out, "--resume", steps=8))
    assert code in (0, 3), err
    assert read_meta(out / "latest.safetensors")["step"] == 8


@pytest.mark.parametrize("damage", ["missing key", "null", "garbage", "wrong types", "cut off"])
def test_a_damaged_metrics_file_costs_at_most_the_picture(data_dir, model_json, run_dir, tmp_path, capsys, damage):
    """metrics.jsonl with a row missing a key, a `null` line, a garbage line, numbers of the wrong
    type or a line cut off by a crash: the resumed run trains to its end and draws loss.png."""
    out = damaged_copy(run_dir, tmp_path / "r", lambda m: None)
    metrics = out / "metrics.jsonl"
    extra = {"missing key": '{"step": 3, "loss": 2.0}\n{"step": 4, "eval": {"all": {}}}\n',
             "null": "null\n", "garbage": "\x00\x01 not json {\n",
             "wrong types": '{"step": "x", "loss": [1], "smma": null}\n{"step": 2, "eval": [1, 2]}\n'
                            '{"step": 2, "eval": {"all": {"loss": "x"}}}\n',
             "cut off": '{"step": 4, "loss": 2.0, "sm'}[damage]
    metrics.write_text(metrics.read_text() + extra)
    (out / "loss.png").unlink(missing_ok=True)
    code, stdout, err = cli(capsys, *train_args(data_dir, model_json, out, "--resume", steps=6))
    assert code in (0, 3), err
    assert "could not draw" not in stdout + err
    assert (out / "loss.png").stat().st_size > 1000


# ---------------------------------------------------------------- 2. Python's JSON limits


LONG_INT = "9" * 5000
DEEP = "[" * 100_000 + "]" * 100_000


def test_one_json_reader_turns_python_limits_into_one_sentence(tmp_path):
    from andrea.files import MAX_JSON_DEPTH, parse_json, read_json

    cases = {"long.json": '{"a": 1,\n "b": ' + LONG_INT + "}", "deep.json": '{"a":\n\n' + DEEP + "}",
             "deep990.json": "[" * 990 + "]" * 990}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(AndreaError, match=r"long\.json holds a number of more than 4,300 digits at line 2"):
        read_json(tmp_path / "long.json", "config file")
    with pytest.raises(AndreaError, match=rf"deep\.json nests its JSON more than {MAX_JSON_DEPTH} levels deep at line 3"):
        read_json(tmp_path / "deep.json", "config file")
    with pytest.raises(AndreaError, match="nests its JSON"):  # parses in Python, but nothing may recurse over it
        read_json(tmp_path / "deep990.json")
    assert parse_json('{"s": "[[[[\\"[[[[", "t": [[1], {"u": [2]}]}', "x") == {"s": '[[[["[[[[', "t": [[1], {"u": [2]}]}
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "x") is not None


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return HarrisTokenizer.train(documents(2, 30), 20).save(tmp_path_factory.mktemp("tok") / "tok")


@pytest.mark.parametrize("bad", ["long", "deep"])
def test_jsonl_sources_with_python_limits_end_in_one_sentence(tokenizer_dir, tmp_path, capsys, bad):
    """A JSONL source whose line 3 holds a 5,000-digit number or nests 100,000 deep: `prepare` (its
    worker pool too) and `tokenizer train` end in one sentence naming the file and the line."""
    value = LONG_INT if bad == "long" else DEEP
    src = tmp_path / "src.jsonl"
    good = "".join(json.dumps({"text": d}) + "\n" for d in documents(5, 2))
    src.write_text(good + '{"text": "x", "n": ' + value + "}\n" + good)
    for args in (["prepare", src, "--tokenizer", tokenizer_dir, "--out", tmp_path / "d", "--workers", "2", "--no-progress"],
                 ["prepare", src, "--tokenizer", tokenizer_dir, "--out", tmp_path / "d1", "--workers", "1", "--no-progress"],
                 ["tokenizer", "train", src, "--segments", "5", "--out", tmp_path / "t"]):
        line = one_sentence(*cli(capsys, *args)[::2])
        assert f"{src} line 3 " in line, line


@pytest.mark.parametrize("bad", ["long", "deep"])
def test_configs_models_and_manifests_with_python_limits_end_in_one_sentence(data_dir, run_dir, tmp_path, capsys, bad):
    """A model config, a training config, a data manifest, a JSON model (andrea and the pure-Python
    engine) and a --sources item holding a 5,000-digit number or nesting 100,000 deep."""
    value = LONG_INT if bad == "long" else DEEP
    model_cfg = tmp_path / "model.json"
    model_cfg.write_text('{"n_layer":\n' + value + "}")
    train_cfg = tmp_path / "train.json"
    train_cfg.write_text('{"max_steps":\n' + value + "}")
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text('{"format": "andrea-shards",\n "version": ' + value + "}")
    model = tmp_path / "m.json"
    model.write_text('{"format": "andrea-json", "version": 1,\n "step": ' + value + "}")
    for args, name in ((["params", "--config", model_cfg], "model.json"),
                       (["train", "--config", train_cfg, "--out", tmp_path / "o"], "train.json"),
                       (["train", "--data", data, "--out", tmp_path / "o2", "--max-steps", "1"], "manifest.json"),
                       (["convert", model, tmp_path / "c.safetensors"], "m.json"),
                       (["train", "--data", data_dir, "--out", tmp_path / "o3", "--max-steps", "1",
                         "--sources", '{"name": "north", "floor": ' + value + "}"], "--sources item")):
        line = one_sentence(*cli(capsys, *args)[::2])
        assert name in line and ("line 2" in line or name == "--sources item"), line
    engine = subprocess.run([sys.executable, str(ROOT / "andrea" / "stdlib_engine.py"), str(model)], capture_output=True,
                            text=True, timeout=60)
    assert engine.returncode == 2 and "Traceback" not in engine.stderr, engine.stderr[-2000:]
    assert engine.stderr.count("\n") == 1 and "m.json" in engine.stderr and "line 2" in engine.stderr


def test_a_checkpoint_whose_metadata_holds_python_limits_ends_in_one_sentence(run_dir, tmp_path, capsys):
    with safe_open(str(run_dir / "latest.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()["andrea"]
    for i, value in enumerate((LONG_INT, DEEP)):
        bad = tmp_path / f"c{i}.safetensors"
        save_file(tensors, str(bad), metadata={"andrea": meta[:-1] + ', "x": ' + value + "}"})
        line = one_sentence(*cli(capsys, "generate", "--checkpoint", bad, "--prompt", "a")[::2])
        assert str(bad) in line and ("4,300 digits" in line or "nests its JSON" in line), line


def test_the_lab_answers_400_to_bodies_at_python_limits(lab_checkpoint):
    """A request body holding a 5,000-digit number, or nested 8,000 or 990 deep (within the body's
    16 KB): 400 with one sentence, never 500."""
    from starlette.testclient import TestClient

    from andrea import embed
    from andrea.web.lab import create_app

    with TestClient(create_app(embed.load_subject(lab_checkpoint)), raise_server_exceptions=False) as client:
        for body in ('{"k": ' + LONG_INT + "}", '{"k": ' + "[" * 8000 + "]" * 8000 + "}",
                     '{"k": ' + "[" * 990 + "]" * 990 + "}"):
            r = client.post("/api/token", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, (r.status_code, r.text[:200])
            assert r.json()["error"].startswith("the request body ")


# ---------------------------------------------------------------- 3. sizes counted before anything is allocated


def big_config(data_dir: Path, path: Path, **changes) -> Path:
    cfg = {"vocab_size": TokenData(data_dir).vocab_size, "n_embd": 32, "n_head": 2, "n_layer": 1, "block_size": 32}
    path.write_text(json.dumps({**cfg, **changes}))
    return path


@pytest.mark.parametrize("changes", [{"n_embd": 100_000}, {"block_size": 10**9}, {"n_layer": 10**6},
                                     {"block_size": 10**9, "pos": "rope"}])
def test_a_model_too_big_for_memory_is_refused_by_arithmetic(data_dir, tmp_path, capsys, changes):
    """Width 10^5, context 10^9 (learned or rope) and 10^6 layers: `train` ends in one sentence that
    says the memory the model would need, before anything is built; `params` still counts it."""
    cfg = big_config(data_dir, tmp_path / "big.json", **changes)
    line = one_sentence(*cli(capsys, "train", "--data", data_dir, "--out", tmp_path / "o", "--model-config", cfg,
                             "--max-steps", "1", "--seq-len", "16", "--no-progress")[::2])
    assert "needs at least" in line and " GB of memory" in line and "available" in line, line
    code, out, _ = cli(capsys, "params", "--config", cfg)
    assert code == 0 and "total" in out


def test_a_huge_model_is_refused_in_a_bounded_process(data_dir, tmp_path):
    """10^6 layers in a real process, under /usr/bin/time: one sentence, little memory."""
    cfg = big_config(data_dir, tmp_path / "big.json", n_layer=10**6)
    done, peak = peak_rss(["train", "--data", data_dir, "--out", tmp_path / "o", "--model-config", cfg,
                           "--max-steps", "1", "--seq-len", "16", "--no-progress"])
    assert "needs at least" in process_sentence(done)
    assert peak < 1_000_000_000, f"peak {peak:,} bytes"


def test_a_batch_too_big_for_memory_is_refused_before_the_first_step(data_dir, model_json, tmp_path, capsys):
    """--batch-size 1048576 (inside the limit of 2^20): refused with the memory it would need, naming
    --micro-batch; with --micro-batch the same batch is within memory and passes the check."""
    args = ["train", "--data", data_dir, "--out", tmp_path / "o", "--model-config", model_json, "--max-steps", "1",
            "--seq-len", "16", "--no-progress", "--batch-size", "1048576"]
    line = one_sentence(*cli(capsys, *args)[::2])
    assert "micro-batches of 1,048,576 × 16 tokens" in line and "--micro-batch" in line and " GB of memory" in line


def test_release_folders_and_json_models_claiming_a_million_layers_are_refused_at_once(run_dir, tmp_path, capsys):
    """A .bin release folder and a JSON model whose config claims 10^6 layers: `convert` (and the
    engine) end in one sentence within seconds, building no model of a million blocks."""
    import time

    release, model = tmp_path / "release", tmp_path / "m.json"
    assert cli(capsys, "convert", run_dir / "latest.safetensors", release, "--to", "bin")[0] == 0
    assert cli(capsys, "convert", run_dir / "latest.safetensors", model, "--to", "json")[0] == 0
    cfg = json.loads((release / "config.json").read_text())
    (release / "config.json").write_text(json.dumps({**cfg, "n_layer": 10**6}))
    doc = json.loads(model.read_text())
    doc["config"]["n_layer"] = 10**6
    model.write_text(json.dumps(doc))
    for src in (release, model):
        start = time.time()
        line = one_sentence(*cli(capsys, "convert", src, tmp_path / "out.safetensors")[::2])
        assert time.time() - start < 10 and "1,000,000" in line, line
    engine = subprocess.run([sys.executable, str(ROOT / "andrea" / "stdlib_engine.py"), str(model)], capture_output=True,
                            text=True, timeout=60)
    assert engine.returncode == 2 and "1,000,000 layers" in engine.stderr and "Traceback" not in engine.stderr


def test_audit_tokens_and_shard_tokens_are_bounded(data_dir, model_json, tokenizer_dir, tmp_path, capsys):
    """--audit-tokens 10^9 and prepare --shard-tokens 1 would run without end: refused at once."""
    line = one_sentence(*cli(capsys, "train", "--data", data_dir, "--out", tmp_path / "o", "--model-config", model_json,
                             "--max-steps", "1", "--audit-tokens", str(10**9))[::2])
    assert "audit.tokens must be at most 10,000" in line
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(documents(4, 3)))
    line = one_sentence(*cli(capsys, "prepare", src, "--tokenizer", tokenizer_dir, "--out", tmp_path / "d",
                             "--shard-tokens", "1", "--no-progress")[::2])
    assert "shard_tokens must be a whole number of tokens from 1,000" in line


# ---------------------------------------------------------------- 4. one huge or hostile document


def prose(seed: int, n_bytes: int) -> str:
    """Sentences of WORDS, with the characters a JSON writer escapes (quotes, backslashes, new
    lines, tabs), letters beyond ASCII and beyond the BMP, until n_bytes."""
    rng = random.Random(seed)
    extra = ['"so"', "back\\slash", "naïve", "😀", "tab\there", "new\nline", "Ünïcödé", "a\u3000b"]
    parts, n = [], 0
    while n < n_bytes:
        s = " ".join(rng.choice(WORDS + extra) for _ in range(30)).capitalize() + ".\n"
        parts.append(s)
        n += len(s)
    return "".join(parts)


def need_time():
    if not os.access("/usr/bin/time", os.X_OK):
        pytest.skip("/usr/bin/time is not installed (apt-get install time); peak memory is measured with it")


def test_a_long_jsonl_line_is_read_in_pieces_that_make_the_same_text_and_tokens(tmp_path):
    """A 5 MB line (longer than a reading chunk) between short ones, its text field after and
    before other fields, written with and without ASCII escapes: read in pieces of at most 1 MiB
    that join to json.loads's text, that encode to exactly the tokens of the whole, and that
    fall in the split of the whole document."""
    from andrea.sources import PIECE_BYTES, documents, first_piece, is_validation, resolve, tasks

    texts = [prose(1, 200), prose(2, 5_000_000), prose(3, 300), prose(4, 4_500_000)]
    path = tmp_path / "long.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"text": texts[0]}) + "\n")
        f.write(json.dumps({"id": 7, "meta": {"a": [1, {"b": "x" * 2_000_000}]}, "text": texts[1], "z": [None, 1.5]}) + "\n")
        f.write(json.dumps({"text": texts[2]}, ensure_ascii=False) + "\n")
        f.write(json.dumps({"text": texts[3], "after": "yes"}, ensure_ascii=False) + "\n")
    got = []
    for task, _ in tasks(resolve(str(path))):
        for text, bos, in_val, n in documents(task):
            assert n <= PIECE_BYTES
            if bos:
                got.append(([text], in_val))
            else:
                got[-1][0].append(text)
    assert [("".join(parts), val) for parts, val in got] == [
        (t, is_validation(first_piece(t.encode("utf-8", "surrogatepass")), 0.05)) for t in texts]
    tok = HarrisTokenizer.train([prose(5, 20_000)], 40)
    for parts, _ in got[1::2]:
        assert len(parts) >= 4
        assert [i for k, p in enumerate(parts) for i in tok.encode(p, bos=k == 0)] == tok.encode("".join(parts))


@pytest.mark.parametrize("line, words", [
    ('{"text": "' + "x" * 5_000_000, "is not valid JSON (unterminated string)"),
    ('{"other": "' + "x" * 5_000_000 + '"}', "has no 'text' field"),
    ('{"m": "' + "x" * 5_000_000 + '", "text": 5}', "has a non-text 'text' field"),
    ('{"text": "' + "x" * 5_000_000 + '"} junk', "is not valid JSON (extra data after the object)"),
    ('{"text": "' + "x" * 5_000_000 + '", "m": ' + "[" * 5000 + "]" * 5000 + "}", "nests its JSON"),
    ('{"text": "' + "x" * 5_000_000 + '", "m": ' + "9" * 5000 + "}", "more than 4,300 digits"),
    ('{"text": "' + "x" * 5_000_000 + '\\q"}', "is not valid JSON (Invalid \\escape)"),
])
def test_a_damaged_long_jsonl_line_ends_in_the_sentence_of_a_short_one(tmp_path, line, words):
    from andrea.sources import documents, resolve, tasks

    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(AndreaError) as e:
        for task, _ in tasks(resolve(str(path))):
            list(documents(task))
    assert str(e.value).startswith(f"{path} line 2 ") and words in str(e.value), e.value


@pytest.mark.slow
def test_one_huge_jsonl_line_costs_its_pieces_not_its_size(tmp_path):
    """A 64 MB one-line JSONL: `tokenizer train --sample-bytes 5M` takes about its budget and
    `prepare` streams it; both peak far below the size of the line (measured with /usr/bin/time;
    reading the line whole peaked at 1.2 GB and 0.5 GB on a 60 MB line)."""
    need_time()
    src = tmp_path / "one.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        f.write('{"text": ')
        f.write(json.dumps("".join(prose(k, 2_000_000) for k in range(32))))
        f.write("}\n")
    done, peak = peak_rss(["tokenizer", "train", src, "--sample-bytes", "5M", "--segments", "30", "--out", tmp_path / "t"])
    assert done.returncode == 0, done.stderr[-2000:]
    taken = int(done.stdout.split(" documents, ")[1].split(" bytes")[0].replace(",", ""))
    assert taken <= 1.5 * 5_000_000 + (1 << 20), done.stdout
    assert peak < 500_000_000, f"tokenizer train peaked at {peak:,} bytes"
    done, peak = peak_rss(["prepare", src, "--tokenizer", tmp_path / "t", "--out", tmp_path / "d", "--no-progress",
                           "--workers", "1"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert peak < 420_000_000, f"prepare peaked at {peak:,} bytes"


@pytest.mark.slow
def test_a_prompt_without_end_is_refused_not_read(run_dir):
    """generate and chat reading /dev/zero: one sentence, exit 2, a bounded read (not MemoryError)."""
    need_time()
    for command in ("generate", "chat"):
        with open("/dev/zero", "rb") as zero:
            done, peak = peak_rss([command, "--checkpoint", run_dir, "--max-new-tokens", "1"], stdin=zero, timeout=120)
        assert "longer than 4 MiB" in process_sentence(done)
        assert peak < 800_000_000, f"{command} peaked at {peak:,} bytes"


def test_text_without_end_is_refused_by_the_tokenizer_commands(tmp_path):
    """`andrea tokenizer encode` and `decode` reading /dev/zero: one sentence at 64 MiB, not MemoryError."""
    HarrisTokenizer([" cat"]).save(tmp_path / "tok")
    for command in ("encode", "decode"):
        with open("/dev/zero", "rb") as zero:
            done, peak = peak_rss(["tokenizer", command, "--tokenizer", tmp_path / "tok"], stdin=zero, timeout=120)
        assert "standard input is longer than 64 MiB" in process_sentence(done)
        assert peak < 800_000_000, f"tokenizer {command} peaked at {peak:,} bytes"


def test_one_very_long_word_costs_training_its_length_not_its_square():
    """A 200,000-letter word (twice, so it could be a candidate) among ordinary text: fitting ends
    in seconds (it grew with the square of the word: 2.3 s at 40,000 letters, over a minute at
    200,000), and no segment is longer than the cap."""
    import time

    from andrea import tokenizer

    rng = random.Random(0)
    word = "".join(rng.choice("abcdefghij") for _ in range(200_000))
    hostile = " ".join("".join(rng.choice("ab") for _ in range(300)) for _ in range(2000))  # peaks everywhere
    texts = [" ".join(rng.choice(WORDS) for _ in range(2000)) for _ in range(20)] + [word + " " + word, hostile]
    start = time.time()
    tok = HarrisTokenizer.train(texts, 15)
    assert time.time() - start < 20
    assert max(len(s) for s in tok.segments) <= getattr(tokenizer, "MAX_WORD_CHARS", 100) + 1
    assert tok.decode(tok.encode(word, bos=False)) == word


@pytest.mark.slow
def test_a_word_list_that_inflates_to_gigabytes_is_never_read_on_load(tmp_path, capsys):
    """harris_words.txt.gz replaced by 1 MB of gzip that inflates to 1 GB: loading the tokenizer
    (encode, prepare) does not inflate it; `inspect`, which needs it, reads at most its cap and
    ends in one sentence; peak memory stays far below the inflated size."""
    import gzip

    need_time()
    folder = HarrisTokenizer.train(documents(2, 30), 20).save(tmp_path / "tok")
    with gzip.open(folder / "harris_words.txt.gz", "wb", compresslevel=1) as f:
        block = b"a" * (64 << 20)
        for _ in range(16):
            f.write(block)
    assert (folder / "harris_words.txt.gz").stat().st_size < 20_000_000
    done, peak = peak_rss(["tokenizer", "encode", "--tokenizer", folder, "the king"])
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    assert peak < 400_000_000, f"encode peaked at {peak:,} bytes"
    done, peak = peak_rss(["tokenizer", "inspect", "--tokenizer", folder, "king"])
    assert "inflates to more than 64 MiB" in process_sentence(done)
    assert peak < 600_000_000, f"inspect peaked at {peak:,} bytes"
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(documents(4, 3)))
    code, _, err = cli(capsys, "prepare", src, "--tokenizer", folder, "--out", tmp_path / "d", "--no-progress")
    assert code == 0, err


@pytest.mark.parametrize("bad", ["deep", "list"])
def test_a_runs_train_json_that_is_not_a_record_ends_embed_similarity_in_one_sentence(run_dir, tmp_path, capsys, bad):
    run = tmp_path / "run"
    run.mkdir()
    (run / "latest.safetensors").write_bytes((run_dir / "latest.safetensors").read_bytes())
    (run / "train.json").write_text('{"data":\n' + DEEP + "}" if bad == "deep" else '["data"]')
    line = one_sentence(*cli(capsys, "embed", "similarity", "--checkpoint", run, "--ppmi")[::2])
    assert "train.json" in line, line
