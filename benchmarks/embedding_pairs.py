"""Do related words get similar rows? cos θ of related and unrelated pairs in a trained model.

For each pair, cos θ between the two words' vectors in the input table (wte) and, separately,
in the output head (lm_head); the two are untied. Words are looked up as they appear inside
running text, with a leading space (" cat"). A word that is not one token is represented by the
mean of its tokens' rows, and the table says so ("mean of N"): such a vector is a blend of
pieces, not a learned word vector, so its row is weaker evidence.

The claim tested (ANDREA's specification): related pairs (cat/dog, cat/pet, king/queen,
man/woman) score above unrelated ones (cat/Tuesday, cat/xylophone, king/the). The script prints
the numbers and says, per table, whether the claim holds, and how clearly.

    .venv/bin/python benchmarks/embedding_pairs.py                       # newest runs/main-*
    .venv/bin/python benchmarks/embedding_pairs.py --checkpoint runs/x/best.safetensors
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

from andrea.errors import AndreaError
from andrea.inside.embed import load_subject, lookup, show_piece, word_vector
from andrea.inside.vectors import table, vector_stats

RELATED = [("cat", "dog"), ("cat", "pet"), ("king", "queen"), ("man", "woman")]
UNRELATED = [("cat", "Tuesday"), ("cat", "xylophone"), ("king", "the")]


def newest_main_checkpoint(root: Path = Path("runs")) -> Path:
    """The newest runs/main-*/best.safetensors, else the newest latest.safetensors."""
    for name in ("best.safetensors", "latest.safetensors"):
        found = sorted(root.glob(f"main-*/{name}"), key=lambda p: p.stat().st_mtime, reverse=True)
        if found:
            return found[0]
    raise AndreaError(f"no runs/main-*/best.safetensors or latest.safetensors under {root}; run `andrea main` "
                      f"or pass --checkpoint PATH.")


def measure_pairs(model, tokenizer) -> list[dict]:
    V = model.config.vocab_size
    mats = {which: table(model, which) for which in ("input", "output")}
    rows = []
    for kind, pairs in (("related", RELATED), ("unrelated", UNRELATED)):
        for a, b in pairs:
            la, lb = lookup(tokenizer, " " + a, V), lookup(tokenizer, " " + b, V)
            row = {"a": a, "b": b, "kind": kind,
                   "a_tokens": [show_piece(p) for p in la.pieces], "b_tokens": [show_piece(p) for p in lb.pieces]}
            for which, m in mats.items():
                row[which] = vector_stats(word_vector(m, la), word_vector(m, lb))["cos"]
            rows.append(row)
    return rows


def single(row: dict) -> bool:
    return len(row["a_tokens"]) == 1 and len(row["b_tokens"]) == 1


def verdict(rows: list[dict], which: str) -> dict | None:
    rel = [r[which] for r in rows if r["kind"] == "related"]
    unr = [r[which] for r in rows if r["kind"] == "unrelated"]
    if not rel or not unr:
        return None
    above = sum(c > max(unr) for c in rel)
    pairs_won = sum(c > u for c in rel for u in unr)
    return {"mean_related": float(np.mean(rel)), "mean_unrelated": float(np.mean(unr)),
            "related_above_every_unrelated": above, "n_related": len(rel),
            "pairwise_wins": pairs_won, "pairwise_total": len(rel) * len(unr)}


def sentence(which: str, v: dict, scope: str = "") -> str:
    name = ("input table (wte)" if which == "input" else "output head (lm_head)") + scope
    wins, total = v["pairwise_wins"], v["pairwise_total"]
    if wins == total:
        holds = "yes: every related pair scores above every unrelated pair"
    elif wins == 0:
        holds = "no: every unrelated pair scores above every related pair"
    elif wins / total >= 0.75:
        holds = "mostly"
    elif wins / total > 0.5:
        holds = "weakly"
    elif wins / total == 0.5:
        holds = "no: as often below as above"
    else:
        holds = "no: mostly below"
    return (f"{name}: related pairs above unrelated ones? {holds} ({wins} of {total} related-vs-unrelated "
            f"comparisons; {v['related_above_every_unrelated']} of {v['n_related']} related pairs above every "
            f"unrelated one; mean cos θ {v['mean_related']:+.3f} related vs {v['mean_unrelated']:+.3f} unrelated).")


def tokens_cell(tokens: list[str]) -> str:
    return tokens[0] if len(tokens) == 1 else f"mean of {len(tokens)}: {' + '.join(tokens)}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a checkpoint file or run folder (default: the newest runs/main-*)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    try:
        path = Path(args.checkpoint) if args.checkpoint else newest_main_checkpoint()
        subject = load_subject(checkpoint=path)
        if subject.tokenizer_note:
            raise AndreaError(f"{path} holds no tokenizer, so words cannot be looked up in it.")
        rows = measure_pairs(subject.model, subject.tokenizer)
    except AndreaError as e:
        print(f"embedding_pairs: error: {e}", file=sys.stderr)
        return 2
    verdicts = {w: verdict(rows, w) for w in ("input", "output")}
    singles = [r for r in rows if single(r)]
    single_verdicts = {w: verdict(singles, w) for w in ("input", "output")} if len(singles) < len(rows) else {}
    if args.json:
        print(json.dumps({"checkpoint": str(path), "rows": rows, "verdict": verdicts,
                          "verdict_single_token_pairs": single_verdicts}, indent=2, ensure_ascii=False))
        return 0
    cfg = subject.model.config
    from andrea.checkpoint import load_checkpoint

    step = load_checkpoint(path).step
    print("# Embedding pairs: cos θ of related and unrelated words\n")
    print(f"checkpoint `{path}` (step {step:,}; d_model {cfg.n_embd}, {cfg.n_layer} layers, V {cfg.vocab_size:,}, "
          f"pos {cfg.pos}); {datetime.date.today().isoformat()}\n")
    print("| pair | kind | tokens of u | tokens of v | cos θ input (wte) | cos θ output (lm_head) |")
    print("|---|---|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['a']} / {r['b']} | {r['kind']} | {tokens_cell(r['a_tokens'])} | {tokens_cell(r['b_tokens'])} | "
              f"{r['input']:+.3f} | {r['output']:+.3f} |")
    print()
    for w in ("input", "output"):
        print("- " + sentence(w, verdicts[w]))
    if single_verdicts:
        print("- Words marked \"mean of N\" are not single tokens in this vocabulary; their vectors are the mean of "
              "their pieces' rows, so those pairs compare spellings as much as meanings. On the pairs of single "
              "tokens only:")
        for w in ("input", "output"):
            v = single_verdicts[w]
            print("  - " + (sentence(w, v, ", single-token pairs") if v else
                            f"{w}: no verdict; it needs at least one related and one unrelated pair of single tokens."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
