"""The main job, end to end: corpus → tokenizer → shards → a CPU-sized model → samples.

Every stage is cached under the cache folder (`~/.cache/andrea`, or `$ANDREA_CACHE`): the corpus
by source, the tokenizer by its settings, the shards by the tokenizer's fingerprint. A second run
reuses them and only trains.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from andrea.cache import shards_dir, tokenizers_dir
from andrea.checkpoint import load_checkpoint, load_model
from andrea.config import N_SPECIAL, ModelConfig, get_preset
from andrea.corpus.registry import DEFAULT_SOURCE_NAMES, fetch_default_corpus, source_key
from andrea.decoding import CHAT_TEMPERATURE, CHAT_TOP_K
from andrea.decoding.generate import TextGenerator
from andrea.errors import AndreaError
from andrea.evaluate import final_evaluation, token_byte_lengths
from andrea.inside.wordsim import fetch_wordsets
from andrea.mainjob_settings import MAIN_RECIPE, RECIPE_SETTINGS, RESERVED_WORDS, SHAPES
from andrea.metrics import read_metrics
from andrea.model import ANDREA, tune_for_training
from andrea.optim import make_optimizer
from andrea.prepare import prepare
from andrea.processor import flush_subnormals, training_autocast
from andrea.shards import PROGRESS_FILE, VERIFIED_FILE, open_token_data
from andrea.tokenizer.harris import WORD_PATTERN, HarrisTokenizer
from andrea.tokenizer.sample import load_training_texts
from andrea.tokenizer.train import TRAINER_VERSION, train_tokenizer
from andrea.train import train
from andrea.trainconfig import TrainConfig


@dataclass
class MainJob:
    preset: str | None = None  # None: the shape of SHAPES for the device it runs on
    minutes: float = 15.0
    steps: int | None = None  # a step budget instead of minutes: a model that does not depend on the machine's speed
    out: Path | None = None
    sampling: str = "ucb"
    seed: int = 1337
    batch_size: int | None = None
    seq_len: int | None = None
    recipe: str = MAIN_RECIPE
    lr: float | None = None  # None: the recipe's own in RECIPE_SETTINGS
    muon_lr: float | None = None  # v3's Muon-trained matrices' own peak rate; None: the recipe's (else lr)
    samples: int = 3
    segments: int | None = None  # the tokenizer's segments, and so the model's vocabulary; None: the preset's
    compile: bool = False  # torch.compile the model (its compile time counts against the minutes)
    model: dict | None = None  # fields of the preset's ModelConfig to replace (width, depth, heads, context): a candidate's shape

    @classmethod
    def on(cls, device: str = "cpu", **changes) -> "MainJob":
        """A job with the model and batch of SHAPES[device] written out (what benchmarks compare)."""
        s = SHAPES[device]
        segments = None if "preset" in changes else s["segments"]  # a named preset keeps its own vocabulary
        return cls(**{"preset": s["preset"], "segments": segments, "batch_size": s["batch_size"],
                      "seq_len": s["seq_len"], **changes})

    def shape(self, device: str) -> dict:
        """Preset, segments, batch, length, evaluation interval and patience on `device` ("cpu" or
        "cuda"): SHAPES[device], with what this job names itself in their place. A preset the job
        names keeps its own vocabulary (segments None) unless the job names segments too."""
        out = dict(SHAPES[device])
        if self.preset is not None:
            out["segments"] = None
        for key in ("preset", "segments", "batch_size", "seq_len"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def model_config(self, shape: dict) -> ModelConfig:
        """The model this job trains in `shape` (`shape(device)`): the preset, with the shape's
        vocabulary and the fields `model` replaces."""
        cfg = get_preset(shape["preset"])
        if shape["segments"] is not None:
            cfg = cfg.replace(vocab_size=shape["segments"] + N_SPECIAL)
        return cfg.replace(**self.model) if self.model else cfg

    def options(self, shape: dict, block_size: int) -> TrainConfig:
        """How the job trains in `shape` (`shape(device)`) a model of this context."""
        return TrainConfig(**self.train_settings(), batch_size=shape["batch_size"], seq_len=min(shape["seq_len"], block_size),
                           time_limit=None if self.steps else self.minutes * 60, max_steps=self.steps,
                           eval_every=shape["eval_every"], patience=shape["patience"], checkpoint_every=100, seed=self.seed,
                           sampling=self.sampling, eval_windows=16, audit={"enabled": False}, compile=self.compile)

    def train_settings(self) -> dict:
        """The recipe's settings of RECIPE_SETTINGS, with lr and muon_lr replaced where given."""
        out = {"recipe": self.recipe, **RECIPE_SETTINGS[self.recipe]}
        for key in ("lr", "muon_lr"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def optimizer(self, model: torch.nn.Module, device: str = "cpu") -> torch.optim.Optimizer:
        """A new optimizer for `model` as this job's training makes it: its recipe and rates
        (train_settings), with training's default weight decay."""
        settings = self.train_settings()
        return make_optimizer(model, settings["recipe"], settings["lr"], TrainConfig.weight_decay, device,
                              muon_lr=settings.get("muon_lr"))


def time_cpu_step(job: MainJob | None = None, steps: int = 3, warmup: int = 1) -> float:
    """Seconds per training step of the main job's CPU shape (model, batch, recipe, optimizer and
    number format as `andrea main` sets them up, on random tokens), the fastest of `steps` after `warmup`: the step
    alone, without the evaluations, checkpoints and snapshots a run adds."""

    job = job or MainJob.on("cpu")
    shape = job.shape("cpu")
    cfg = job.model_config(shape)
    torch.manual_seed(job.seed)
    model = ANDREA(cfg)
    tune_for_training(model, torch.device("cpu"))
    opt = job.optimizer(model)
    g = torch.Generator().manual_seed(job.seed)
    x, y = (torch.randint(0, cfg.vocab_size, (shape["batch_size"], min(shape["seq_len"], cfg.block_size)), generator=g)
            for _ in range(2))
    best = float("inf")
    for i in range(warmup + steps):
        start = time.perf_counter()
        with training_autocast("cpu"):
            loss = model(x, targets=y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            best = min(best, time.perf_counter() - start)
    return best


def tokenizer_folder(n_segments: int, names) -> Path:
    """Where the main job keeps its tokenizer of n_segments fitted on these sources."""
    names = sorted(source_key(n) for n in names)
    key = f"{n_segments}|{'+'.join(names)}|{WORD_PATTERN}|{TRAINER_VERSION}|{'+'.join(RESERVED_WORDS)}"
    key = hashlib.sha256(key.encode()).hexdigest()[:16]
    return tokenizers_dir() / f"harris-{n_segments}-{key}"


def cached_main_data() -> Path | None:
    """The main job's shard folder on this machine's CPU shape (andrea-cpu's vocabulary, the
    default sources), when it is prepared; else None."""
    folder = tokenizer_folder(get_preset(MainJob.on("cpu").preset).n_segments, DEFAULT_SOURCE_NAMES)
    if not (folder / "harris_segments.json").is_file():
        return None
    data = shards_dir() / HarrisTokenizer.load(folder).fingerprint()[:16]
    return data if (data / "manifest.json").is_file() else None


def prepared_tokenizer(n_segments: int, names: list[str], log=print):
    """The tokenizer for the main job: trained once, then loaded from the cache.

    It is fitted on the training text of every source weighted as the curriculum opens (an equal
    share each), not on a raw file head, so a large source cannot dominate the segment alphabet.
    """
    folder = tokenizer_folder(n_segments, names)
    if (folder / "harris_segments.json").exists():
        try:
            tok = HarrisTokenizer.load(folder)
            if tok.vocab_size != n_segments + N_SPECIAL:  # whole, but not what this folder's name promises
                raise AndreaError(f"{folder} holds {tok.vocab_size - N_SPECIAL:,} segments, not {n_segments:,}")
            return tok, folder
        except (AndreaError, OSError, ValueError) as e:  # damaged: fitted again, what was there set aside
            log(f"note: fitting the tokenizer again ({str(e).rstrip('.')})")
            set_aside_strays(folder, log, everything=True)
    log(f"training the Harris tokenizer ({n_segments:,} segments), an equal share of text per source")
    texts, weights = load_training_texts(names, {n: 1.0 for n in names})
    tok = train_tokenizer(texts, n_segments, weights=weights, progress=True, reserve=RESERVED_WORDS)
    tok.save(folder)
    return tok, folder


def prepared_data(tokenizer, source_names: list[str], log=print) -> Path:

    folder = shards_dir() / tokenizer.fingerprint()[:16]
    if (folder / "manifest.json").exists():
        try:
            open_token_data(folder, tokenizer, log=log)  # what training checks first, checked here so a failure heals
            return folder
        except (AndreaError, OSError) as e:
            log(f"note: preparing the shards again ({str(e).rstrip('.')})")
            set_aside_strays(folder, log)  # a folder, link or FIFO where a file belongs
            # a finished folder is trusted by prepare: forget what it recorded, so every shard is written anew
            for name in ("manifest.json", PROGRESS_FILE, VERIFIED_FILE):
                (folder / name).unlink(missing_ok=True)
    log(f"tokenizing {len(source_names)} sources into {folder}")
    prepare(tokenizer, source_names, folder, log=log)
    return folder


def set_aside_strays(folder: Path, log=print, everything: bool = False) -> None:
    """Rename aside what in a cached folder is not a regular file (or, with `everything`, all it
    holds), so that the stage can write its files there again; nothing is deleted."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
        if ".set-aside-" in entry.name or not (everything or entry.is_symlink() or not entry.is_file()):
            continue
        aside = entry.with_name(f"{entry.name}.set-aside-{stamp}")
        entry.rename(aside)
        log(f"note: {entry} was not a file of the cache's own; it is now {aside.name}")


def fetch_scoring_sets(log=print) -> None:
    """The word-similarity sets the run scores at every evaluation; without them it trains on."""
    try:
        fetch_wordsets(log=log)
    except AndreaError as e:
        log(f"note: training without word-similarity scores: {e}")


def main_job_data(n_segments: int, log=print) -> tuple[list[str], object, Path, Path]:
    """Stages 1-3 of the main job: (source names, tokenizer, its folder, shard folder), cached."""
    names = list(fetch_default_corpus(log=log))
    fetch_scoring_sets(log)
    tokenizer, tok_dir = prepared_tokenizer(n_segments, names, log)
    if tokenizer.n_segments != n_segments:
        raise AndreaError(f"the tokenizer found {tokenizer.n_segments:,} segments, the model needs {n_segments:,}.")
    return names, tokenizer, tok_dir, prepared_data(tokenizer, names, log)


def run_main_job(job: MainJob, log=print) -> dict:
    flush_subnormals()  # first: torch's threads keep the mode they start with (andrea.processor)
    t0 = time.time()
    shape = job.shape("cuda" if torch.cuda.is_available() else "cpu")
    cfg = job.model_config(shape)
    log("1/4 corpus, 2/4 tokenizer, 3/4 token shards (each cached after its first run)")
    names, tokenizer, tok_dir, data_dir = main_job_data(cfg.n_segments, log)
    out = Path(job.out) if job.out else Path("runs") / time.strftime("main-%Y%m%d-%H%M%S")
    budget = f"{job.steps:,} steps" if job.steps else f"at most {job.minutes:g} minutes"
    log(f"4/4 training {shape['preset']} (V {cfg.vocab_size:,}) at {shape['batch_size']} x {shape['seq_len']} for {budget} into {out}")
    opts = job.options(shape, cfg.block_size)
    result = train(cfg, opts, data_dir, out, log=log)

    best = out / "best.safetensors"
    chosen = best if best.exists() else result.checkpoint
    best_step = load_checkpoint(chosen).step
    best_eval = _eval_at(out / "metrics.jsonl", best_step) or result.eval
    model, tok, _ = load_model(chosen)
    log(f"evaluating {chosen} on every source's held-out text (the final figure, outside the training budget)")
    final = final_evaluation(model, open_token_data(data_dir, tok), opts.seq_len, token_byte_lengths(tok, cfg.vocab_size))
    generator = TextGenerator(model, tok)
    samples = []
    for i, prompt in enumerate(PROMPTS[: job.samples]):
        greedy = generator.generate(prompt, max_new_tokens=60, greedy=True)
        sampled = generator.generate(prompt, max_new_tokens=60, temperature=CHAT_TEMPERATURE, top_k=CHAT_TOP_K, seed=i)
        samples.append({"prompt": prompt, "greedy": greedy, "sampled": sampled,
                        "greedy_repeated_4grams": repeated_ngram_share(prompt + greedy),
                        "sampled_repeated_4grams": repeated_ngram_share(prompt + sampled)})
    chat = generator.chat(max_new_tokens=60, seed=0)  # andrea chat's own sampling
    exchange = []
    for line in CHAT_LINES:
        reply = "".join(chat.reply(line))
        exchange.append({"line": line, "reply": reply, "ended": chat.ended})
    summary = {
        "preset": shape["preset"],
        "vocab_size": cfg.vocab_size,
        "recipe": job.recipe,
        "stopped": result.stopped,
        # the final evaluation of the checkpoint the samples come from, on all the held-out text
        "val_bpb": final["all"]["bpb"],
        "val_bpb_se": final["all"]["se"],
        "val_bpb_by_source": {n: m["bpb"] for n, m in final.items() if n != "all"},
        "val_tokens": final["all"]["tokens"],
        "final_eval_seconds": final["all"]["seconds"],
        "last_eval_bpb": result.eval["all"]["bpb"],  # the last evaluation during training (a few windows)
        "best_step": best_step,
        "best_val_bpb": best_eval["all"]["bpb"],
        "steps": result.step,
        "tokens_per_s": result.tokens_per_s,
        "mfu": result.mfu,
        "train_seconds": result.elapsed,
        "total_seconds": time.time() - t0,
        "checkpoint": str(result.checkpoint),
        "best_checkpoint": str(chosen),
        "tokenizer": str(tok_dir),
        "data": str(data_dir),
        "samples": samples,
        "chat": exchange,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# One prompt per kind of text the default corpus holds: a chat, a story, a speech.
PROMPTS = ["I have a cat and a dog", "On Tuesday morning she", "The people of the United States"]
# A chat's lines, in andrea chat's turn format: the main job's samples end with one exchange.
CHAT_LINES = ["Hi, how are you?", "Do you have any pets?"]


def repeated_ngram_share(text: str, n: int = 4) -> float:
    """The share of the text's word n-grams that already occurred earlier in it: 0 for text that
    never repeats itself, near 1 for a loop ("of the United States of the United States ...")."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    seen, repeated = set(), 0
    for g in grams:
        repeated += g in seen
        seen.add(g)
    return repeated / len(grams)


def _eval_at(metrics: Path, step: int) -> dict | None:
    """The evaluation logged at `step` in a run's metrics.jsonl (None when there is none)."""
    found = None
    for row in read_metrics(metrics):
        if row.get("step") == step and isinstance(row.get("eval"), dict):
            found = row["eval"]
    return found
