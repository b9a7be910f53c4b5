"""Where andrea keeps what it fetches and builds, in one place: `~/.cache/andrea`, or the folder
named by `$ANDREA_CACHE`.

    corpus/<source>/      the fetched sources' documents (andrea.corpus.registry)
    tokenizers/           the main job's fitted tokenizers, keyed by their settings (andrea.mainjob)
    shards/<fingerprint>/ the main job's token shards, keyed by the tokenizer (andrea.mainjob)
    wordsets/             SimLex-999, WordSim-353 and the analogies (andrea.inside.wordsim)
    bench*/               what the benchmark scripts prepare for themselves
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$ANDREA_CACHE`, or ~/.cache/andrea."""
    root = os.environ.get("ANDREA_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "andrea"


def corpus_dir() -> Path:
    return cache_root() / "corpus"


def tokenizers_dir() -> Path:
    return cache_root() / "tokenizers"


def shards_dir() -> Path:
    return cache_root() / "shards"


def wordsets_dir() -> Path:
    return cache_root() / "wordsets"
