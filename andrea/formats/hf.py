"""Hugging Face export and import: a `GPT2LMHeadModel` folder.

GPT-2 is ANDREA's architecture with biases: learned positions, pre-norm LayerNorm blocks, an MLP
of 4d. So a model with pos = learned and norm = layernorm maps exactly; its linear layers get
zero biases, and `tie_word_embeddings` is false because ANDREA's head is its own matrix. GPT-2's
Conv1D stores weights [in][out], so every linear matrix is transposed, and wq, wk, wv are
concatenated into c_attn. Activations: relu -> "relu"; gelu -> "gelu" (transformers'
GELUActivation is torch's exact erf F.gelu; "gelu_new" is the tanh approximation and would
not match); relu2 -> "relu2" (transformers' ReLUSquaredActivation, relu(x)², which its GPT-2 reads
from the same activation table; runtimes with a fixed list of GPT-2 activations may lack it).

The folder: config.json, model.safetensors, harris_segments.json, the tokenizer transformers
loads (tokenizer_config.json, tokenization_andrea.py and andrea_engine.py: AutoTokenizer with
trust_remote_code=True, which needs nothing of andrea), tokenizer.json where the segments mark no
word ends, and README.md. The tokenizer class (remote/tokenization_andrea.py) takes the encoding
rule from andrea_engine.py, a verbatim copy of andrea.stdlib_engine. A model exported without a
tokenizer still gets the class, which refuses to load with a sentence that says why, so
transformers never builds an empty tokenizer in its place.
tokenizer.json is for the `tokenizers` library and reproduces HarrisTokenizer.encode exactly: a
Split pre-tokenizer with WORD_PATTERN, its Python character classes spelt out as explicit ranges
(Oniguruma's \\w, \\d and \\s differ from Python's on some characters), then byte-level
characters, then WordPiece with no continuation prefix, which is the same leftmost-longest
match; every byte is in the vocabulary, so it never needs an unknown token.
Nothing here imports transformers; reading a folder reads safetensors only (never a pickle).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from andrea.checkpoint import Checkpoint
from andrea.config import BOS, ModelConfig
from andrea.errors import AndreaError
from andrea.files import atomic_output, atomic_write_bytes, read_json
from andrea.formats.common import SEGMENTS_FILE, check_weights, checked_tokenizer, read_segments
from andrea.tokenizer.harris import is_word_end

ACT_TO_HF = {"relu": "relu", "gelu": "gelu", "relu2": "relu2"}
# the tokenizer transformers loads with trust_remote_code: its class, and the engine that holds the rule
REMOTE = Path(__file__).parent / "remote"
REMOTE_FILES = {"tokenization_andrea.py": REMOTE / "tokenization_andrea.py",
                "andrea_engine.py": Path(__file__).parents[1] / "stdlib_engine.py"}
TOKENIZER_CONFIG = {"tokenizer_class": "AndreaTokenizer",
                    "auto_map": {"AutoTokenizer": ["tokenization_andrea.AndreaTokenizer", None]},
                    "bos_token": "<BOS>", "eos_token": "<BOS>", "add_bos_token": True,
                    "split_special_tokens": True, "clean_up_tokenization_spaces": False}
HF_TO_ACT = {v: k for k, v in ACT_TO_HF.items()}
EPS = 1e-5


# ---------------------------------------------------------------- export


def check_exportable(cfg: ModelConfig) -> None:
    if cfg.pos != "learned":
        raise AndreaError(f"GPT-2 has learned positions only, so a model with {cfg.pos} positions has no Hugging Face GPT-2 form.")
    if cfg.norm != "layernorm":
        raise AndreaError(f"GPT-2 has LayerNorm only, so a model with {cfg.norm} has no Hugging Face GPT-2 form.")


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size, "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": 4 * cfg.n_embd,
        "activation_function": ACT_TO_HF[cfg.act], "layer_norm_epsilon": EPS,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": False, "use_cache": True, "bos_token_id": BOS, "eos_token_id": BOS,
    }


def hf_tensors(cfg: ModelConfig, state: dict) -> dict[str, torch.Tensor]:
    """Our weights under GPT-2's names and layouts."""
    d = cfg.n_embd
    out = {"transformer.wte.weight": state["wte.weight"], "transformer.wpe.weight": state["wpe.weight"]}
    for i in range(cfg.n_layer):
        p, h = f"h.{i}.", f"transformer.h.{i}."
        qkv = torch.cat([state[p + f"attn.{w}.weight"] for w in ("wq", "wk", "wv")])
        out.update({
            h + "ln_1.weight": state[p + "ln_1.weight"], h + "ln_1.bias": state[p + "ln_1.bias"],
            h + "attn.c_attn.weight": qkv.T, h + "attn.c_attn.bias": torch.zeros(3 * d),
            h + "attn.c_proj.weight": state[p + "attn.wo.weight"].T, h + "attn.c_proj.bias": torch.zeros(d),
            h + "ln_2.weight": state[p + "ln_2.weight"], h + "ln_2.bias": state[p + "ln_2.bias"],
            h + "mlp.c_fc.weight": state[p + "mlp.fc1.weight"].T, h + "mlp.c_fc.bias": torch.zeros(4 * d),
            h + "mlp.c_proj.weight": state[p + "mlp.fc2.weight"].T, h + "mlp.c_proj.bias": torch.zeros(d),
        })
    out.update({"transformer.ln_f.weight": state["ln_f.weight"], "transformer.ln_f.bias": state["ln_f.bias"],
                "lm_head.weight": state["lm_head.weight"]})
    return {k: v.detach().float().contiguous().clone() for k, v in out.items()}


def write_hf(path, ckpt: Checkpoint) -> list[str]:
    """Write ckpt as a Hugging Face GPT2LMHeadModel folder with its tokenizer files."""
    cfg = ckpt.config
    check_exportable(cfg)
    state = check_weights(cfg, ckpt.model_state, "the model")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise AndreaError(f"{path} is a file; a Hugging Face model is a folder.")
    path.mkdir(parents=True, exist_ok=True)
    with atomic_output(path / "model.safetensors") as tmp:
        save_file(hf_tensors(cfg, state), str(tmp), metadata={"format": "pt"})
    atomic_write_bytes(path / "config.json", (json.dumps(hf_config(cfg), indent=2) + "\n").encode())
    notes = []
    if cfg.act == "relu2":
        notes.append("activation relu2 is written as \"relu2\" (transformers' ReLUSquaredActivation); runtimes "
                     "with a fixed list of GPT-2 activations may not know it.")
    tok = ckpt.tokenizer_dict
    # the tokenizer's code travels whether or not there are segments: without them, loading it says so
    for name, source in REMOTE_FILES.items():
        atomic_write_bytes(path / name, source.read_bytes())
    atomic_write_bytes(path / "tokenizer_config.json", (json.dumps(TOKENIZER_CONFIG, indent=2) + "\n").encode())
    if tok is not None:
        segments = tok["segments"]
        atomic_write_bytes(path / SEGMENTS_FILE, (json.dumps(segments, ensure_ascii=True, indent=0) + "\n").encode())
        if any(map(is_word_end, segments)):
            (path / "tokenizer.json").unlink(missing_ok=True)
            notes.append("the tokenizer marks word ends (\" cat</w>\"), which no `tokenizers` model expresses, so the "
                         "folder has no tokenizer.json; AutoTokenizer loads it with trust_remote_code=True.")
        else:
            atomic_write_bytes(path / "tokenizer.json", json.dumps(tokenizers_json(segments), ensure_ascii=False).encode())
    else:
        (path / SEGMENTS_FILE).unlink(missing_ok=True)
        (path / "tokenizer.json").unlink(missing_ok=True)
        notes.append("the model has no tokenizer, so the folder has no segments, and loading its tokenizer says so.")
    word_ends = tok is not None and any(map(is_word_end, tok["segments"]))
    atomic_write_bytes(path / "README.md", readme(cfg, tok is not None, word_ends).encode())
    if ckpt.optim_state is not None:
        notes.append("the Hugging Face folder holds no optimizer state (weights and tokenizer only).")
    return notes


# ---------------------------------------------------------------- tokenizer.json


@lru_cache(maxsize=1)
def _word_pattern_for_oniguruma() -> str:
    """WORD_PATTERN with \\w, \\d and \\s replaced by the ranges Python's re gives them here."""
    chars = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)

    def ranges(regex: str) -> str:
        parts = []
        for m in re.finditer(regex, chars):
            a, b = ord(m.group()[0]), ord(m.group()[-1])
            parts.append(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}")
        return "".join(parts)

    letters, digits, spaces, symbols = (ranges(r) for r in (r"[^\W\d_]+", r"\d+", r"\s+", r"[^\s\w]+"))
    return (rf"'(?:[sdmt]|ll|ve|re)| ?[{letters}]+| ?[{digits}]+| ?[{symbols}]+|_+"
            rf"|[{spaces}]+(?![^{spaces}])|[{spaces}]+")


def _byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: byte b -> a printable character."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def tokenizers_json(segments: list[str]) -> dict:
    """A `tokenizers` Tokenizer that encodes as HarrisTokenizer does (BOS first)."""
    chars = _byte_chars()
    vocab = {chars[b]: b for b in range(256)}
    vocab["<BOS>"] = BOS
    for i, s in enumerate(segments):
        # a one-character segment takes its byte's entry: encode never emits that byte alone either
        vocab["".join(chars[b] for b in s.encode("utf-8", "surrogatepass"))] = 257 + i
    bos = {"SpecialToken": {"id": "<BOS>", "type_id": 0}}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": _word_pattern_for_oniguruma()}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<BOS>": {"id": "<BOS>", "ids": [BOS], "tokens": ["<BOS>"]}}},
        "decoder": byte_level,
        "model": {"type": "WordPiece", "unk_token": "<BOS>", "continuing_subword_prefix": "",
                  "max_input_chars_per_word": 2**31 - 1, "vocab": vocab},
    }


WORD_END_NOTE = """This tokenizer marks word ends: a segment written " cat</w>" stands for the bytes of " cat"
and is taken only where the rest of a word of letters is " cat"; no other segment ends such a word
(the plain " cat" only begins cats). No `tokenizers` model expresses that, so there is no
tokenizer.json; the rule, in plain Python:"""
WORD_END_STEP = """            i, end = 0, word[-1].isalnum() and not word[-1].isdecimal() and word[0] != "'"
            while i < len(word):
                if end and word[i:] + "</w>" in ids_of:    # a word end takes the rest of a letter word
                    ids.append(ids_of[word[i:] + "</w>"])
                    break                          # ... else the longest segment that starts at i
                for j in range(min(len(word) - end, i + longest), i, -1):   # and ends before a letter word's end ..."""


def readme(cfg: ModelConfig, has_tokenizer: bool, word_ends: bool = False) -> str:
    tok = """## Tokens

Ids 0-255 are raw bytes, 256 is BOS (it starts every document and ends generation), and 257 on are
the segments of `harris_segments.json`, in the file's order (id = 257 + index).

With transformers, the folder's own tokenizer class gives exactly the ids ANDREA gives (its code,
tokenization_andrea.py and andrea_engine.py, is in the folder and needs nothing else):

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained("path/to/this/folder", trust_remote_code=True)
    ids = tok("The cat sat").input_ids            # starts with BOS (256)
    text = tok.decode(ids)                        # the text again, exactly

With the `tokenizers` library, `tokenizer.json` gives exactly the ids ANDREA's HarrisTokenizer gives:

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file("tokenizer.json")
    ids = tok.encode("The cat sat").ids           # starts with BOS (256)
    text = tok.decode([i for i in ids if i != 256])

Its character classes are those of the Python that wrote it; a character that Unicode classified
later may be split differently. The rule itself, in plain Python:

    import json, re
    WORD = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[^\\W\\d_]+| ?\\d+| ?[^\\s\\w]+|_+|\\s+(?!\\S)|\\s+")
    segments = json.load(open("harris_segments.json", encoding="utf-8"))
    ids_of = {s: 257 + i for i, s in enumerate(segments)}
    longest = max(map(len, segments))

    def encode(text):
        ids = [256]
        for word in WORD.findall(text):            # segments never span two words
            i = 0
            while i < len(word):                   # the longest segment that starts at i ...
                for j in range(min(len(word), i + longest), i, -1):
                    if word[i:j] in ids_of:
                        ids.append(ids_of[word[i:j]])
                        i = j
                        break
                else:                              # ... else the UTF-8 bytes of one character
                    ids.extend(word[i].encode("utf-8", "surrogatepass"))
                    i += 1
        return ids
""" if has_tokenizer else ("## Tokens\n\nThis model was exported without a tokenizer: loading one from this folder "
                           "fails and says so.\n")
    if word_ends:
        lib = tok[tok.index("With the `tokenizers` library"): tok.index("The rule itself, in plain Python:") + 33]
        step = tok[tok.index("            i = 0\n"): tok.index("i + longest), i, -1):") + 21]
        tok = tok.replace(lib, WORD_END_NOTE).replace(step, WORD_END_STEP)
    return f"""# ANDREA model in Hugging Face GPT-2 form

An ANDREA model ({cfg.n_layer} layers, d = {cfg.n_embd}, {cfg.n_head} heads, context {cfg.block_size},
V = {cfg.vocab_size}, activation {cfg.act}) written by `andrea convert --to hf`. GPT-2's linear
biases are all zero (ANDREA's layers have none) and the output head is not tied to the token table.

    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained("path/to/this/folder")
    logits = model(torch.tensor([ids])).logits

{tok}"""


# ---------------------------------------------------------------- import


def read_hf(path) -> tuple[Checkpoint, list[str]]:
    """A checkpoint from a GPT2LMHeadModel folder whose biases are zero (as an export leaves them)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise AndreaError(f"{path} has no config.json, so it is not a Hugging Face model folder.")
    hf = read_json(path / "config.json", "Hugging Face config")
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        raise AndreaError(f"{path / 'config.json'} is not a GPT-2 config (model_type {hf.get('model_type') if isinstance(hf, dict) else None!r}).")
    cfg = _config_from_hf(hf, path)
    notes = []
    weights = path / "model.safetensors"
    if not weights.is_file():
        if (path / "pytorch_model.bin").exists():
            raise AndreaError(f"{path} holds pytorch_model.bin, a pickle, which andrea does not load; save it with safetensors.")
        raise AndreaError(f"{path} has config.json but no model.safetensors.")
    tensors = _read_safetensors(weights)
    state, more = _state_from_hf(cfg, tensors, bool(hf.get("tie_word_embeddings", True)), weights)
    state = check_weights(cfg, state, str(weights))
    meta = {"step": 0}
    if (path / SEGMENTS_FILE).is_file():
        meta["tokenizer"] = checked_tokenizer(read_segments(path / SEGMENTS_FILE), cfg, str(path / SEGMENTS_FILE))
    else:
        notes.append(f"{path} has no {SEGMENTS_FILE}, so the model comes without a tokenizer.")
    return Checkpoint(config=cfg, model_state=state, meta=meta), notes + more


def _config_from_hf(hf: dict, path: Path) -> ModelConfig:
    where = path / "config.json"
    act = hf.get("activation_function", "gelu_new")
    if act not in HF_TO_ACT:
        raise AndreaError(f"{where} uses activation {act!r}; ANDREA has relu, gelu (exact) and relu2.")
    values = {}
    for ours, theirs in (("vocab_size", "vocab_size"), ("n_embd", "n_embd"), ("n_head", "n_head"),
                         ("n_layer", "n_layer"), ("block_size", "n_positions")):
        v = hf.get(theirs)
        if type(v) is not int:
            raise AndreaError(f"{where} has no whole number {theirs}.")
        values[ours] = v
    cfg = ModelConfig(**values, pos="learned", norm="layernorm", act=HF_TO_ACT[act])
    if hf.get("n_inner") not in (None, 4 * cfg.n_embd):
        raise AndreaError(f"{where} has an MLP of n_inner = {hf['n_inner']}; ANDREA's is 4·n_embd = {4 * cfg.n_embd}.")
    if hf.get("layer_norm_epsilon", EPS) != EPS:
        raise AndreaError(f"{where} has layer_norm_epsilon {hf['layer_norm_epsilon']}; ANDREA's LayerNorm uses {EPS}.")
    if not hf.get("scale_attn_weights", True) or hf.get("scale_attn_by_inverse_layer_idx", False):
        raise AndreaError(f"{where} scales attention other than by 1/sqrt(head size), as ANDREA does.")
    return cfg


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError) as e:
        raise AndreaError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__}).") from None


def _state_from_hf(cfg: ModelConfig, tensors: dict, tied: bool, where: Path) -> tuple[dict, list[str]]:
    t = {k.removeprefix("transformer."): v for k, v in tensors.items()
         if not k.endswith((".attn.bias", ".attn.masked_bias"))}  # GPT-2's causal-mask buffers

    def take(name):
        if name not in t:
            raise AndreaError(f"{where} has no tensor {name}.")
        return t.pop(name)

    def zero_bias(name):
        b = take(name)
        if b.numel() and bool((b != 0).any()):
            raise AndreaError(f"{where}: {name} is not zero, and ANDREA's linear layers have no biases to hold it.")

    def matrix(name, shape):
        w = take(name)
        if tuple(w.shape) != shape:
            raise AndreaError(f"{where}: {name} has shape {list(w.shape)}, but the config needs {list(shape)}.")
        return w.T

    d = cfg.n_embd
    state = {"wte.weight": take("wte.weight"), "wpe.weight": take("wpe.weight")}
    for i in range(cfg.n_layer):
        h, p = f"h.{i}.", f"h.{i}."
        qkv = matrix(h + "attn.c_attn.weight", (d, 3 * d))
        state.update({p + "ln_1.weight": take(h + "ln_1.weight"), p + "ln_1.bias": take(h + "ln_1.bias"),
                      p + "attn.wq.weight": qkv[:d], p + "attn.wk.weight": qkv[d : 2 * d], p + "attn.wv.weight": qkv[2 * d :],
                      p + "attn.wo.weight": matrix(h + "attn.c_proj.weight", (d, d)),
                      p + "ln_2.weight": take(h + "ln_2.weight"), p + "ln_2.bias": take(h + "ln_2.bias"),
                      p + "mlp.fc1.weight": matrix(h + "mlp.c_fc.weight", (d, 4 * d)),
                      p + "mlp.fc2.weight": matrix(h + "mlp.c_proj.weight", (4 * d, d))})
        for b in ("attn.c_attn.bias", "attn.c_proj.bias", "mlp.c_fc.bias", "mlp.c_proj.bias"):
            zero_bias(h + b)
    state.update({"ln_f.weight": take("ln_f.weight"), "ln_f.bias": take("ln_f.bias")})
    notes = []
    head = t.pop("lm_head.weight", None)
    if tied:
        state["lm_head.weight"] = state["wte.weight"].clone()
        notes.append("the model ties its head to the token table, so lm_head is a copy of wte.")
    elif head is None:
        raise AndreaError(f"{where} has no tensor lm_head.weight and does not tie it to the token table.")
    else:
        state["lm_head.weight"] = head
    if t:
        raise AndreaError(f"{where} has a tensor {sorted(t)[0]} that ANDREA's GPT-2 form has no place for.")
    return {k: v.contiguous() for k, v in state.items()}, notes
