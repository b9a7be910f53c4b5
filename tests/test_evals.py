"""andrea.evals and the grown model in the tools people use: lm-evaluation-harness scores the
repository's own tasks on the exported folder (`--model hf`) and against `andrea serve`
(`--model local-completions`) exactly as andrea scores them itself; TransformerLens boots the
folder alone, tokenizes as andrea does, sees andrea's attention weights, and its detect_head
score relates to andrea's head score by the definitions' factor."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from andrea import evals
from andrea.config import BOS
from andrea.decoding.generate import load as load_generator
from andrea.formats import convert
from andrea.inside.heads import head_scores

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "benchmarks" / "lm_eval_tasks"
sys.path.insert(0, str(TASKS))
import items as task_items  # noqa: E402  (the tasks' own reader of their items)

MC, GEN = task_items.rows("lesson_mc.jsonl"), task_items.rows("lesson_gen.jsonl")
UNTIL, MAX_TOKENS = ["\n", "."], 8  # andrea_lesson_gen.yaml's generation_kwargs


@pytest.fixture(scope="module")
def grown(lab_checkpoint, tmp_path_factory):
    """The lab's small trained model, and its Hugging Face folder (`andrea convert --to hf`)."""
    g = load_generator(lab_checkpoint)
    folder = tmp_path_factory.mktemp("evals") / "hf"
    convert(lab_checkpoint, folder, "hf")
    return g, folder


@pytest.fixture
def offline(monkeypatch):
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")


# ---------------------------------------------------------------- andrea's own scoring


def test_a_request_is_split_as_the_harness_splits_it_and_scored_from_the_models_log_softmax(grown):
    g, _ = grown
    tok, model = g.tokenizer, g.model
    ctx, cont = evals.split(tok, "The cat sat on the ", "mat")  # the trailing space moves to the continuation
    assert ctx == tok.encode("The cat sat on the", bos=True) and ctx[0] == BOS
    assert ctx + cont == tok.encode("The cat sat on the mat", bos=True)
    ll, greedy = evals.loglikelihood(model, tok, "The cat sat on the", " mat")
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ctx + cont]))[0][0].double(), -1)
    want = sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))
    assert ll == pytest.approx(want, abs=1e-9)
    assert greedy == all(int(logp[len(ctx) - 1 + i].argmax()) == t for i, t in enumerate(cont))
    r = evals.multiple_choice(model, tok, MC)
    assert r["n"] == len(MC) == 20 and len(r["loglikelihoods"][0]) == 3
    assert r["acc"] == np.mean([int(np.argmax(s)) == it["answer"] for s, it in zip(r["loglikelihoods"], MC)])


# ---------------------------------------------------------------- lm-evaluation-harness, both ways


def harness(model: str, model_args: dict) -> dict:
    """The harness run as benchmarks/bench_lm_eval.py runs it, its output without the seconds."""
    pytest.importorskip("lm_eval")
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_lm_eval import harness as the_benchmarks

    return the_benchmarks(model, model_args)[0]


def check_against_andrea(out: dict, own_mc: dict, own_gen: dict) -> None:
    res = out["results"]
    assert res["andrea_lesson_mc"]["acc,none"] == own_mc["acc"]
    assert res["andrea_lesson_gen"]["exact_match,strip"] == own_gen["exact_match"]
    by_doc = {s["doc_id"]: s for s in out["samples"]["andrea_lesson_mc"]}
    for i, lls in enumerate(own_mc["loglikelihoods"]):
        theirs = [r[0] for r in by_doc[i]["filtered_resps"]]
        np.testing.assert_allclose(theirs, lls, atol=1e-4)  # float32 against andrea's float64 log-softmax
    replies = {s["doc_id"]: s["filtered_resps"][0] for s in out["samples"]["andrea_lesson_gen"]}
    assert [replies[i] for i in range(len(GEN))] == [r.strip() for r in own_gen["replies"]]


def test_the_harness_scores_the_export_and_the_server_as_andrea_does(grown, offline):
    from andrea.web.api import Served, ServeServer

    g, folder = grown
    own_mc = evals.multiple_choice(g.model, g.tokenizer, MC)
    own_gen = evals.exact_match(g.model, g.tokenizer, GEN, UNTIL, MAX_TOKENS)
    on_folder = harness("hf", {"pretrained": str(folder), "tokenizer": str(folder), "trust_remote_code": True,
                               "add_bos_token": True, "dtype": "float32"})
    check_against_andrea(on_folder, own_mc, own_gen)
    server = ServeServer(Served(g.model, g.tokenizer, "lab"), "127.0.0.1", 0, max_batch=2)
    url = server.start()
    try:
        served = harness("local-completions", {
            "base_url": f"{url.rstrip('/')}/v1/completions", "model": "lab", "tokenizer_backend": "huggingface",
            "tokenizer": str(folder), "trust_remote_code": True, "add_bos_token": True, "num_concurrent": 1,
            "max_retries": 1, "max_length": g.model.config.block_size})
    finally:
        server.stop()
    check_against_andrea(served, own_mc, own_gen)


# ---------------------------------------------------------------- TransformerLens


def test_transformer_lens_boots_the_folder_and_sees_andreas_tokens_weights_and_head_scores(grown, offline):
    pytest.importorskip("transformer_lens")
    from transformer_lens.head_detector import detect_head
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    g, folder = grown
    model, tok = g.model, g.tokenizer
    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu", trust_remote_code=True,
                                                 tokenizer=AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True))
    text = "The cat sat on a mat and the dog ran to its pet owner."
    ids = tok.encode(text, bos=True)
    assert bridge.to_tokens(text)[0].tolist() == ids
    with torch.no_grad():
        theirs = bridge(text)[0]
        ours = model(torch.tensor([ids]))[0][0]
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    _, cache = bridge.run_with_cache(text)
    weights = model.trace(torch.tensor([ids]), keep=("weights",))["weights"]
    for layer, w in enumerate(weights):
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"][0], w[0], atol=1e-5, rtol=1e-5)

    # a repeated sequence of whole words, BOS + r + r, as andrea's head scores read it
    words = [w for w in ("cat", "dog", "mat", "pet", "owner", "kings", "queens", "ideas") if len(tok.word_ids(w)) == 1]
    probe = "".join(" " + w for w in words + words)
    pids = tok.encode(probe, bos=True)
    n, T = len(words), len(pids)
    assert n >= 4 and pids[1 : n + 1] == pids[n + 1 :]
    p = np.stack([w.double().numpy() for w in model.trace(torch.tensor([pids]), keep=("weights",))["weights"]])
    ours, _ = head_scores(p, n)
    tl = detect_head(bridge, probe, "previous_token_head").numpy()
    # TransformerLens: the weight on i - 1 summed over every row, over all weight (T rows of 1);
    # andrea: its mean over the rows 2 .. 2n. They differ by row 1's weight on BOS:
    # T · TL = a[1, 0] + (T - 2) · andrea.
    np.testing.assert_allclose(T * tl, p[:, 0, :, 1, 0] + (T - 2) * ours["previous"], atol=1e-5)
