"""lm-evaluation-harness on the main job's model, both ways, beside andrea's own scoring.

Exports the checkpoint to a Hugging Face folder (`andrea convert --to hf`), scores the
repository's own tasks (benchmarks/lm_eval_tasks: andrea_lesson_mc, andrea_lesson_gen) with
`andrea.evals`, then runs the harness offline with `--model hf` on the folder and with
`--model local-completions` against `andrea serve` on 127.0.0.1 (in this process, one torch
thread for the server as `andrea serve` takes on two cores), and prints each path's figures, the
largest difference of a choice's log-likelihood from andrea's, and the seconds each took.

    .venv/bin/python benchmarks/bench_lm_eval.py                               # newest runs/main-*
    .venv/bin/python benchmarks/bench_lm_eval.py --checkpoint runs/candidates/t128-seed-1337
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench_chat import newest_main_run
from common import machine_line, md_table, say

TASKS = Path(__file__).resolve().parent / "lm_eval_tasks"
UNTIL, MAX_TOKENS = ["\n", "."], 8  # andrea_lesson_gen.yaml's generation_kwargs


def harness(model: str, model_args: dict) -> tuple[dict, float]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=["andrea_lesson_mc", "andrea_lesson_gen"],
                                  task_manager=TaskManager(include_path=str(TASKS)), batch_size=1, device="cpu",
                                  log_samples=True)
    return out, time.perf_counter() - start


def figures(out: dict, own_mc: dict) -> dict:
    res = out["results"]
    by_doc = {s["doc_id"]: s for s in out["samples"]["andrea_lesson_mc"]}
    gap = max(abs(r[0] - ll) for i, lls in enumerate(own_mc["loglikelihoods"])
              for r, ll in zip(by_doc[i]["filtered_resps"], lls))
    replies = {s["doc_id"]: s["filtered_resps"][0] for s in out["samples"]["andrea_lesson_gen"]}
    return {"acc": res["andrea_lesson_mc"]["acc,none"], "exact": res["andrea_lesson_gen"]["exact_match,strip"], "gap": gap,
            "replies": [replies[i] for i in range(len(replies))]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, help="a run folder or checkpoint (default: the newest runs/main-*)")
    args = ap.parse_args(argv)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[name] = "1"
    sys.path.insert(0, str(TASKS))
    import items
    import torch

    from andrea import evals
    from andrea.decoding.generate import load
    from andrea.formats import convert
    from andrea.web.api import Served, ServeServer, model_id

    checkpoint = args.checkpoint or newest_main_run()
    g = load(checkpoint)
    mc, gen = items.rows("lesson_mc.jsonl"), items.rows("lesson_gen.jsonl")
    say(f"andrea's own scoring of {len(mc)} + {len(gen)} items")
    start = time.perf_counter()
    own_mc = evals.multiple_choice(g.model, g.tokenizer, mc)
    own_gen = evals.exact_match(g.model, g.tokenizer, gen, UNTIL, MAX_TOKENS)
    rows = [["andrea.evals", f"{own_mc['acc']:.3f}", f"{own_gen['exact_match']:.3f}", "0", f"{time.perf_counter() - start:.1f}"]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "hf"
        convert(checkpoint, folder, "hf")
        say("lm_eval --model hf on the exported folder")
        out, secs = harness("hf", {"pretrained": str(folder), "tokenizer": str(folder), "trust_remote_code": True,
                                   "add_bos_token": True, "dtype": "float32"})
        f = figures(out, own_mc)
        same_replies = [f["replies"] == [r.strip() for r in own_gen["replies"]]]
        rows.append(["lm_eval --model hf (the folder)", f"{f['acc']:.3f}", f"{f['exact']:.3f}", f"{f['gap']:.1e}", f"{secs:.1f}"])
        say("lm_eval --model local-completions against andrea serve")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        server = ServeServer(Served(g.model, g.tokenizer, model_id(checkpoint)), "127.0.0.1", 0, max_batch=4,
                             layout_threads=threads)
        url = server.start()
        try:
            out, secs = harness("local-completions", {
                "base_url": f"{url.rstrip('/')}/v1/completions", "model": model_id(checkpoint),
                "tokenizer_backend": "huggingface", "tokenizer": str(folder), "trust_remote_code": True,
                "add_bos_token": True, "num_concurrent": 1, "max_retries": 1, "max_length": g.model.config.block_size})
        finally:
            server.stop()
            torch.set_num_threads(threads)
        f = figures(out, own_mc)
        same_replies.append(f["replies"] == [r.strip() for r in own_gen["replies"]])
        rows.append(["lm_eval --model local-completions (andrea serve)", f"{f['acc']:.3f}", f"{f['exact']:.3f}",
                     f"{f['gap']:.1e}", f"{secs:.1f}"])
    print(machine_line(torch.__version__))
    print(f"checkpoint {checkpoint}; tasks andrea_lesson_mc ({len(mc)} items, acc) and andrea_lesson_gen ({len(gen)} items, "
          f"exact match); BOS first on every request (add_bos_token=True)\n")
    print(md_table(["scored by", "multiple choice acc", "generation exact match", "largest log-likelihood difference", "seconds"],
                   rows, right={1, 2, 3, 4}))
    agree = len({(r[1], r[2]) for r in rows}) == 1 and all(same_replies)
    print(f"\nthe three agree on both tasks, every generated reply the same: {'yes' if agree else 'NO'}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
