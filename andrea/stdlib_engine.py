"""A pure-Python ANDREA engine: load a portable JSON model, tokenize, compute logits, sample.

Standard library only (no torch, no numpy). The file stands alone: copy it next to a model
written by `andrea convert SRC model.json --to json` and run

    python engine.py model.json --prompt "The cat" --max-new-tokens 40 --temperature 0.8 --top-k 40

(inside the package, `python -m andrea.stdlib_engine ...` does the same). Every multiply is a Python
float operation, so it suits small models, reading, and checking the torch model against an
independent implementation; it computes in double precision from the float32 weights.

The model, one token at a time with a KV cache (plain lists):
    x = wte[id] + wpe[t]                          (or sinusoids, or rotary q and k, or nothing)
    x = x + wo·attn(ln_1(x)); x = x + fc2·act(fc1·ln_2(x))   per layer
    logits = lm_head·ln_f(x)
The tokenizer follows HarrisTokenizer's rule: split into words with WORD_PATTERN, then take the
longest segment at each position of a word, else the UTF-8 bytes of one character; where the
segments mark word ends (" cat</w>"), a letter word takes a word end where the rest of it is the
word end's text, and no plain segment ends it. Generation
follows andrea.decoding.generate: it stops at BOS, and past the context the window restarts from its last
half. Sampling: greedy (temperature 0), else logits / temperature, top-k, one draw from
random.Random(seed).
"""

from __future__ import annotations

import argparse
import codecs
import json
import math
import os
import random
import re
import stat
import sys
from operator import mul

BOS = 256
FIRST_SEGMENT = 257
EPS = 1e-5
WORD_PATTERN = r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|_+|\s+(?!\S)|\s+"
WORD_RE = re.compile(WORD_PATTERN)
FORMAT = "andrea-json"


class EngineError(ValueError):
    """A model file or an argument the engine cannot use; the message is one sentence."""


def _surrogatepass_or_replace(err):
    # as HarrisTokenizer.decode: a lone surrogate's three bytes come back, other bad bytes are U+FFFD
    if not isinstance(err, UnicodeDecodeError):
        raise err
    b = err.object[err.start : err.start + 3]
    if len(b) == 3 and b[0] == 0xED and 0xA0 <= b[1] <= 0xBF and 0x80 <= b[2] <= 0xBF:
        return chr(0xD000 | (b[1] & 0x3F) << 6 | (b[2] & 0x3F)), err.start + 3
    return "\ufffd", err.end


codecs.register_error("andrea.stdlib_engine", _surrogatepass_or_replace)


# ---------------------------------------------------------------- tokenizer


class Tokenizer:
    def __init__(self, segments):
        self.segments = list(segments)
        self.ids = {s: FIRST_SEGMENT + i for i, s in enumerate(self.segments)}
        self.max_len = max(map(len, self.segments), default=1)
        self.marks = any(s.endswith("</w>") for s in self.segments)
        self.token_bytes = [bytes([b]) for b in range(256)] + [b""] + [s.removesuffix("</w>").encode("utf-8", "surrogatepass")
                                                                          for s in self.segments]

    @property
    def vocab_size(self) -> int:
        return FIRST_SEGMENT + len(self.segments)

    def encode(self, text: str, bos: bool = True) -> list:
        ids = [BOS] if bos else []
        for word in WORD_RE.findall(text):
            i, n = 0, len(word)
            marked = self.marks and word[-1].isalnum() and not word[-1].isdecimal() and word[0] != "'"
            while i < n:
                if marked and word[i:] + "</w>" in self.ids:  # a word end: the rest of the word
                    ids.append(self.ids[word[i:] + "</w>"])
                    break
                for j in range(min(n - marked, i + self.max_len), i, -1):  # marked: no plain segment ends it
                    t = self.ids.get(word[i:j])
                    if t is not None:
                        ids.append(t)
                        i = j
                        break
                else:
                    ids.extend(word[i].encode("utf-8", "surrogatepass"))
                    i += 1
        return ids

    def decode(self, ids) -> str:
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise EngineError(f"token id {i} is out of range: ids must be in 0..{self.vocab_size - 1}.")
        return b"".join(self.token_bytes[i] for i in ids).decode("utf-8", "andrea.stdlib_engine")


# ---------------------------------------------------------------- arithmetic on lists


def dot(a, b) -> float:
    return sum(map(mul, a, b))


def matvec(rows, x) -> list:
    return [sum(map(mul, row, x)) for row in rows]


def add(a, b) -> list:
    return [x + y for x, y in zip(a, b)]


def layernorm(x, w, b) -> list:
    mu = sum(x) / len(x)
    var = sum((v - mu) ** 2 for v in x) / len(x)
    s = 1.0 / math.sqrt(var + EPS)
    return [(v - mu) * s * wi + bi for v, wi, bi in zip(x, w, b)]


def rmsnorm(x, w) -> list:
    s = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + EPS)
    return [v * s * wi for v, wi in zip(x, w)]


def softmax(xs) -> list:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    total = sum(e)
    return [v / total for v in e]


ACTIVATIONS = {
    "relu2": lambda x: x * x if x > 0 else 0.0,
    "relu": lambda x: x if x > 0 else 0.0,
    "gelu": lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))),
}


# ---------------------------------------------------------------- the model


def param_shapes(cfg: dict) -> dict:
    """name -> shape of every parameter a config needs, in the model's order."""
    d, V, T = cfg["n_embd"], cfg["vocab_size"], cfg["block_size"]
    norm = ["weight", "bias"] if cfg["norm"] == "layernorm" else ["weight"]
    shapes = {"wte.weight": [V, d]}
    if cfg["pos"] == "learned":
        shapes["wpe.weight"] = [T, d]
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        shapes.update({p + "ln_1." + k: [d] for k in norm})
        shapes.update({p + f"attn.{w}.weight": [d, d] for w in ("wq", "wk", "wv", "wo")})
        shapes.update({p + "ln_2." + k: [d] for k in norm})
        shapes.update({p + "mlp.fc1.weight": [4 * d, d], p + "mlp.fc2.weight": [d, 4 * d]})
    shapes.update({"ln_f." + k: [d] for k in norm})
    shapes["lm_head.weight"] = [V, d]
    return shapes


class Cache:
    """Keys and values of every position so far, per layer: lists of d-vectors."""

    def __init__(self, n_layer: int):
        self.k = [[] for _ in range(n_layer)]
        self.v = [[] for _ in range(n_layer)]

    def __len__(self) -> int:
        return len(self.k[0]) if self.k else 0


def read_json(path):
    """The JSON value of a file, or one EngineError sentence naming it and the line.

    andrea's own reader (andrea.files.parse_json) does this for the package; the engine keeps its
    own copy because it must run from a copy of this one file with the standard library alone.
    Python's limits end in a sentence too: nesting too deep to parse (RecursionError) and integers
    of more than 4,300 digits (ValueError)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise EngineError(f"cannot read {path} ({e.strerror or e}).") from None
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise EngineError(f"{path} is not UTF-8 text, so not JSON.") from None
    except json.JSONDecodeError as e:
        raise EngineError(f"{path} is not valid JSON ({e.msg} at line {e.lineno:,}).") from None
    except RecursionError:
        depth, line = _deepest(raw)
        raise EngineError(f"{path} nests its JSON too deeply to read ({depth:,} levels at line {line:,}).") from None
    except ValueError:
        found = re.search(rb"\d{4301,}", raw)
        line = raw.count(b"\n", 0, found.start()) + 1 if found else 1
        raise EngineError(f"{path} holds a number of more than 4,300 digits at line {line:,}, which is no number "
                          f"this engine reads.") from None


def _deepest(raw: bytes) -> tuple[int, int]:
    """(deepest nesting of arrays and objects, the line it is reached on), strings skipped."""
    depth, most, at = 0, 0, 0
    for m in re.finditer(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', raw, re.S):
        c = m.group()
        if c in (b"[", b"{"):
            depth += 1
            if depth > most:
                most, at = depth, m.start()
        elif c in (b"]", b"}"):
            depth -= 1
    return most, raw.count(b"\n", 0, at) + 1


class Model:
    def __init__(self, config: dict, tensors: dict, tokenizer: Tokenizer | None = None):
        self.config = config
        self.tokenizer = tokenizer
        self.n_layer, self.n_head = config["n_layer"], config["n_head"]
        self.d, self.block_size = config["n_embd"], config["block_size"]
        self.head_dim = self.d // self.n_head
        self.act = ACTIVATIONS[config["act"]]
        self.w = {}
        for name, shape in param_shapes(config).items():
            data = tensors[name]
            # matrices as lists of rows; vectors as flat lists
            self.w[name] = [data[r * shape[1] : (r + 1) * shape[1]] for r in range(shape[0])] if len(shape) == 2 else data

    @classmethod
    def load(cls, path) -> "Model":
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read, a device never end
                raise EngineError(f"{path} is not a regular file; give the JSON model's file.")
        except OSError as e:
            raise EngineError(f"cannot read {path} ({e.strerror or e}).") from None
        doc = read_json(path)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise EngineError(f"{path} is not an ANDREA JSON model (no \"format\": \"{FORMAT}\").")
        cfg = _checked_config(doc.get("config"), path)
        tensors = {}
        given = doc.get("tensors") if isinstance(doc.get("tensors"), dict) else {}
        if cfg["n_layer"] > len(given):  # before the config's layers are laid out one by one
            raise EngineError(f"{path}: its config has {cfg['n_layer']:,} layers, but the file holds only "
                              f"{len(given):,} tensors (a layer has six or more).")
        for name, shape in param_shapes(cfg).items():
            t = given.get(name)
            data = _flat(t)
            if not isinstance(t, dict) or t.get("shape") != shape or data is None or len(data) != math.prod(shape):
                raise EngineError(f"{path}: tensor {name} is missing or not of shape {shape}; write the file with "
                                  f"`andrea convert ... --to json`.")
            tensors[name] = data
        tok = doc.get("tokenizer")
        tokenizer = None
        if tok is not None:
            if not isinstance(tok, dict) or tok.get("word_pattern", WORD_PATTERN) != WORD_PATTERN:
                raise EngineError(f"{path} has a tokenizer that splits words another way than this engine.")
            segments = tok.get("segments", [])
            if (not isinstance(segments, list) or not all(isinstance(s, str) and s for s in segments)
                    or len(set(segments)) != len(segments)):
                raise EngineError(f"{path}: the tokenizer's segments are not a list of distinct, non-empty strings.")
            tokenizer = Tokenizer(segments)
            if tokenizer.vocab_size != cfg["vocab_size"]:
                raise EngineError(f"{path}: the tokenizer has V = {tokenizer.vocab_size} but the model V = {cfg['vocab_size']}.")
        return cls(cfg, tensors, tokenizer)

    # ---- one token through the model

    def position(self, x, t: int) -> list:
        if self.config["pos"] == "learned":
            return add(x, self.w["wpe.weight"][t])
        if self.config["pos"] == "sinusoidal":
            d = self.d
            # PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(t / 10000^(2i/d)), scaled to row norm 1
            scale = math.sqrt(2.0 / d)
            return [v + scale * (math.sin if j % 2 == 0 else math.cos)(t * math.exp(-math.log(10000.0) * (j - j % 2) / d))
                    for j, v in enumerate(x)]
        return x

    def rope(self, x, t: int) -> list:
        """Rotate each pair (x[2i], x[2i+1]) of every head by t / 10000^(2i/head_dim)."""
        out, hd = list(x), self.head_dim
        for h in range(0, self.d, hd):
            for i in range(0, hd, 2):
                angle = t / 10000.0 ** (i / hd)
                c, s = math.cos(angle), math.sin(angle)
                a, b = x[h + i], x[h + i + 1]
                out[h + i], out[h + i + 1] = a * c - b * s, a * s + b * c
        return out

    def norm(self, x, prefix: str) -> list:
        if self.config["norm"] == "layernorm":
            return layernorm(x, self.w[prefix + ".weight"], self.w[prefix + ".bias"])
        return rmsnorm(x, self.w[prefix + ".weight"])

    def attend(self, q, keys, values) -> list:
        out, hd, scale = [], self.head_dim, 1.0 / math.sqrt(self.head_dim)
        for a in range(0, self.d, hd):
            b = a + hd
            qh = q[a:b]
            p = softmax([dot(qh, k[a:b]) * scale for k in keys])
            for c in range(a, b):
                out.append(sum(pj * v[c] for pj, v in zip(p, values)))
        return out

    def forward(self, token: int, cache: Cache) -> list:
        """Logits of the next token after `token`, which sits at position len(cache)."""
        t = len(cache)
        if not 0 <= token < self.config["vocab_size"]:
            raise EngineError(f"token id {token} is out of range: ids must be in 0..{self.config['vocab_size'] - 1}.")
        if t >= self.block_size:
            raise EngineError(f"position {t} is past the context of {self.block_size}.")
        w = self.w
        x = self.position(list(w["wte.weight"][token]), t)
        for i in range(self.n_layer):
            p = f"h.{i}."
            h = self.norm(x, p + "ln_1")
            q, k, v = (matvec(w[p + f"attn.{n}.weight"], h) for n in ("wq", "wk", "wv"))
            if self.config["pos"] == "rope":
                q, k = self.rope(q, t), self.rope(k, t)
            cache.k[i].append(k)
            cache.v[i].append(v)
            x = add(x, matvec(w[p + "attn.wo.weight"], self.attend(q, cache.k[i], cache.v[i])))
            h = [self.act(u) for u in matvec(w[p + "mlp.fc1.weight"], self.norm(x, p + "ln_2"))]
            x = add(x, matvec(w[p + "mlp.fc2.weight"], h))
        return matvec(w["lm_head.weight"], self.norm(x, "ln_f"))

    def logits(self, ids) -> list:
        """Logits after every position of ids (one list of V numbers per id)."""
        cache = Cache(self.n_layer)
        return [self.forward(i, cache) for i in ids]

    # ---- generation

    def generate(self, prompt_ids, max_new_tokens: int = 64, temperature: float = 1.0, top_k: int | None = None,
                 seed: int | None = None, stop_at_bos: bool = True) -> list:
        """New token ids after prompt_ids; temperature 0 is greedy."""
        if not prompt_ids:
            raise EngineError("the prompt is empty; give at least one token.")
        if max_new_tokens < 1 or not (math.isfinite(temperature) and temperature >= 0) or (top_k is not None and top_k < 1):
            raise EngineError("max-new-tokens and top-k must be at least 1 and temperature a finite number, at least 0.")
        rng = random.Random(seed)
        T, keep = self.block_size, max(1, self.block_size // 2)
        seq = list(prompt_ids)
        w = 0 if len(seq) <= T else len(seq) - keep
        cache = Cache(self.n_layer)
        logits = [self.forward(i, cache) for i in seq[w:]][-1]
        out = []
        for n in range(max_new_tokens):
            tok = sample(logits, temperature, top_k, rng)
            if stop_at_bos and tok == BOS:
                break
            out.append(tok)
            if n + 1 == max_new_tokens:
                break
            seq.append(tok)
            if len(seq) - w > T:  # the window is full: restart it from its last half
                w = len(seq) - keep
                cache = Cache(self.n_layer)
                logits = [self.forward(i, cache) for i in seq[w:]][-1]
            else:
                logits = self.forward(tok, cache)
        return out


def sample(logits, temperature: float, top_k: int | None, rng: random.Random) -> int:
    if temperature == 0:
        return max(range(len(logits)), key=logits.__getitem__)  # the first of equal maxima, as argmax
    top = max(logits)
    scaled = [(x - top) / temperature for x in logits]  # at most 0 and never NaN, however small the temperature
    if top_k is not None and top_k < len(scaled):
        kth = sorted(scaled, reverse=True)[top_k - 1]
        scaled = [x if x >= kth else -math.inf for x in scaled]
    probs = softmax(scaled)
    r, acc = rng.random(), 0.0
    for i, p in enumerate(probs):
        acc += p
        if r < acc:
            return i
    return max(i for i, p in enumerate(probs) if p > 0)  # r fell in the rounding gap at the top


def _flat(t):
    """The flat data of a tensor entry, or None."""
    if isinstance(t, dict) and isinstance(t.get("data"), list):
        data = t["data"]
        if all(type(x) in (int, float) and math.isfinite(x) for x in data):
            return [float(x) for x in data]
    return None


def _checked_config(cfg, path) -> dict:
    if not isinstance(cfg, dict):
        raise EngineError(f"{path} has no \"config\" object.")
    for key in ("vocab_size", "n_embd", "n_head", "n_layer", "block_size"):
        if type(cfg.get(key)) is not int or cfg[key] < 1:
            raise EngineError(f"{path}: config field {key} must be a positive integer.")
    if cfg["n_embd"] % cfg["n_head"] or (cfg.get("pos") == "rope" and (cfg["n_embd"] // cfg["n_head"]) % 2):
        raise EngineError(f"{path}: n_embd must split into n_head heads (of even size for rope).")
    for key, allowed in (("pos", ("learned", "sinusoidal", "rope", "none")), ("norm", ("layernorm", "rmsnorm")),
                         ("act", tuple(ACTIVATIONS))):
        if cfg.get(key) not in allowed:
            raise EngineError(f"{path}: config field {key} must be one of {', '.join(allowed)}.")
    return cfg


# ---------------------------------------------------------------- command line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m andrea.stdlib_engine",
                                description="Continue a prompt with an ANDREA JSON model, in pure Python.")
    p.add_argument("model", help="a JSON model written by `andrea convert SRC DST --to json`")
    p.add_argument("--prompt", default="", help="the text to continue (default: start from BOS alone)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="0 is greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    args = p.parse_args(argv)
    try:
        model = Model.load(args.model)
        if model.tokenizer is None:
            raise EngineError(f"{args.model} holds no tokenizer, so it cannot turn text into tokens.")
        ids = model.tokenizer.encode(args.prompt)
        new = model.generate(ids, args.max_new_tokens, 0.0 if args.greedy else args.temperature, args.top_k, args.seed)
        sys.stdout.write(model.tokenizer.decode(new) + "\n")
    except EngineError as e:
        print(f"engine: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
