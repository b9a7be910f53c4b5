"""The cache folder: ~/.cache/andrea unless $ANDREA_CACHE names another, and its named parts."""

from __future__ import annotations

from andrea import cache


def test_the_cache_is_under_home_unless_the_environment_names_one(monkeypatch, tmp_path):
    monkeypatch.delenv("ANDREA_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_root() == tmp_path / "home" / ".cache" / "andrea"
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "elsewhere"))
    assert cache.cache_root() == tmp_path / "elsewhere"
    monkeypatch.setenv("ANDREA_CACHE", "")  # set but empty: the default
    assert cache.cache_root() == tmp_path / "home" / ".cache" / "andrea"


def test_each_part_is_a_folder_of_the_cache_and_nothing_is_made(monkeypatch, tmp_path):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "c"))
    parts = {cache.corpus_dir(): "corpus", cache.wordsets_dir(): "wordsets",
             cache.tokenizers_dir(): "tokenizers", cache.shards_dir(): "shards"}
    assert {p.relative_to(tmp_path / "c").as_posix() for p in parts} == set(parts.values())
    assert not (tmp_path / "c").exists()
