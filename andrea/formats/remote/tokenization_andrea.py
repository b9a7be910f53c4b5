"""ANDREA's Harris tokenizer for transformers: `AutoTokenizer.from_pretrained(folder, trust_remote_code=True)`.

This file travels in a Hugging Face folder written by `andrea convert RUN OUT --to hf`, beside
`andrea_engine.py` (andrea's standard-library engine, which holds the encoding rule) and
`harris_segments.json` (the segments, id = 257 + index). It needs transformers and nothing of
andrea. It gives the ids andrea gives, BOS (256) first, on every string, and decodes them to the
exact text: ids 0-255 are raw bytes, 256 is BOS (it starts every document and ends generation),
and a segment that marks a word end (" cat</w>") is taken only at the end of a word of letters.
As transformers' tokenizers do, `decode` shows BOS as its own text, "<BOS>", unless
`skip_special_tokens=True`, which gives the text alone (andrea's `decode`); tools such as
lm-evaluation-harness read the BOS string to tell whether a text already begins with it.

Text is never split around special tokens: "<BOS>" in a text is five characters, as andrea reads
it. Token strings (`convert_ids_to_tokens`) are "<0xNN>" for a raw byte, "<BOS>" for BOS and the
segment's own text for a segment (with "</w>" after a word end), so every id has its own string.
"""

from __future__ import annotations

import json
import os

from transformers import PreTrainedTokenizer

from .andrea_engine import BOS, FIRST_SEGMENT, Tokenizer

SEGMENTS_FILE = "harris_segments.json"


class AndreaTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"segments_file": SEGMENTS_FILE}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, segments_file=None, bos_token="<BOS>", eos_token="<BOS>", **kwargs):
        if segments_file is None or not os.path.isfile(segments_file):
            raise ValueError(f"this folder has no {SEGMENTS_FILE}, so it carries no ANDREA tokenizer: the model was "
                             "exported without one, and no other tokenizer encodes as it was trained.")
        with open(segments_file, encoding="utf-8") as f:
            segments = json.load(f)
        if not isinstance(segments, list) or not all(isinstance(s, str) for s in segments):
            raise ValueError(f"{segments_file} is not a list of segments, so it is no ANDREA tokenizer.")
        self.rule = Tokenizer(segments)
        self.segments_file = segments_file
        self.pieces = [f"<0x{b:02X}>" for b in range(256)] + ["<BOS>"] + list(segments)
        self.piece_ids = {p: i for i, p in enumerate(self.pieces)}
        kwargs.setdefault("split_special_tokens", True)  # "<BOS>" in a text is text
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        add_bos_token = kwargs.pop("add_bos_token", True)  # as andrea trains: every document after BOS
        super().__init__(bos_token=bos_token, eos_token=eos_token, **kwargs)
        self.add_bos_token = add_bos_token
        self.init_kwargs["add_bos_token"] = add_bos_token  # kept by save_pretrained

    @property
    def vocab_size(self) -> int:
        return self.rule.vocab_size

    def get_vocab(self) -> dict:
        return dict(self.piece_ids)

    def _tokenize(self, text, **kwargs):
        return [self.pieces[i] for i in self.rule.encode(text, bos=False)]

    def _convert_token_to_id(self, token):
        if token not in self.piece_ids:
            raise ValueError(f"{token!r} is no token of this tokenizer.")
        return self.piece_ids[token]

    def _convert_id_to_token(self, index):
        return self.pieces[index]

    def convert_tokens_to_string(self, tokens) -> str:
        return self.rule.decode([self._convert_token_to_id(t) for t in tokens])

    def _decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None, **kwargs) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        if skip_special_tokens:
            return self.rule.decode([i for i in ids if i != BOS])
        runs, run = [], []  # as transformers' tokenizers do, a special token shows as its own text
        for i in ids:
            if i == BOS:
                runs.append(run)
                run = []
            else:
                run.append(i)
        return self.bos_token.join(self.rule.decode(r) for r in runs + [run])

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        ids = ([BOS] if self.add_bos_token else []) + list(token_ids_0)
        return ids if token_ids_1 is None else ids + list(token_ids_1)

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
        if already_has_special_tokens:
            return [int(i == BOS) for i in token_ids_0 + (token_ids_1 or [])]
        return ([1] if self.add_bos_token else []) + [0] * (len(token_ids_0) + len(token_ids_1 or []))

    def create_token_type_ids_from_sequences(self, token_ids_0, token_ids_1=None):
        return [0] * len(self.build_inputs_with_special_tokens(token_ids_0, token_ids_1))

    def save_vocabulary(self, save_directory, filename_prefix=None):
        path = os.path.join(save_directory, (f"{filename_prefix}-" if filename_prefix else "") + SEGMENTS_FILE)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.pieces[FIRST_SEGMENT:], f, ensure_ascii=True, indent=0)
            f.write("\n")
        return (path,)
