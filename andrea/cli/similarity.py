"""`andrea embed similarity` (the standard scores), `andrea embed timeline` (the tables learning) and
`andrea embed split` (what the blocks make of one token in the words it begins)."""

from __future__ import annotations

import argparse
import math
import sys

from andrea.cli.common import check_source, print_json
from andrea.validate import flag_number, parse_number

TABLE_NAMES = {"input": "input table (wte)", "output": "output head (lm_head)", "ppmi": "PPMI + SVD reference"}


def _rho(s: dict) -> str:
    if s["n"] < 3 or not math.isfinite(s["rho"]):
        return f"{'n/a':>7} (n {s['n']:>4})"
    return f"{s['rho']:+.3f} ± {s['null']:.3f} (n {s['n']:>4})"


def _run_data(args, tokenizer, purpose: str = "for the PPMI reference"):
    """--data, else the data folder the run recorded in its train.json (andrea.usage.run_data),
    either opened through the one gate with the model's tokenizer (andrea.shards.open_token_data)."""
    from andrea.errors import AndreaError
    from andrea.shards import open_token_data
    from andrea.usage import run_data

    if args.data:
        return open_token_data(args.data, tokenizer)
    data, why = run_data(args.checkpoint, tokenizer)
    if data is None:
        raise AndreaError(f"{why}; give --data DIR {purpose}.")
    return data


def cmd_similarity(args) -> int:
    from andrea.errors import AndreaError
    from andrea.inside.embed import load_subject
    from andrea.inside.wordsim import load_wordsets, model_tables, ppmi_vectors, similarity, train_token_chunks, word_index
    from andrea.usage import STANDALONE_RULE, run_usage

    check_source(args)
    if args.ppmi and not args.checkpoint and not args.data:
        raise AndreaError("--ppmi counts a run's training tokens: give --data DIR beside --preset.")
    subject = load_subject(args.checkpoint, args.preset, args.seed, args.tokenizer)
    model, tok = subject.model, subject.tokenizer
    V, d = model.config.vocab_size, model.config.n_embd
    sets = load_wordsets()
    index = word_index(tok, V, sets)
    usage, usage_note = run_usage(args.checkpoint, tok, log=lambda m: print(m, file=sys.stderr))
    if usage is not None:
        index.standalone = usage.standalone_words()
    if args.layer is not None:
        return _layers(args, model, tok, sets)
    tables = model_tables(model)
    if args.ppmi:
        data = _run_data(args, tok)
        tables["ppmi"] = ppmi_vectors(train_token_chunks(data), V, d)
    report = similarity(tables, index, sets, analogies=not args.no_analogies).to_dict()
    report["model"] = subject.name
    report["standalone_rule"] = None if usage is None else f"both words single tokens {STANDALONE_RULE}"
    report["usage_unknown"] = usage_note or None
    if args.json:
        print_json(report)
        return 0
    print_report(report)
    return 0


def _layers(args, model, tok, sets) -> int:
    """--layer: word vectors from the blocks beside the tables, on the same pairs (andrea.inside.context_vectors)."""
    from andrea.errors import AndreaError
    from andrea.inside.context_vectors import CONTEXT, USES, score_layers

    L = model.config.n_layer
    uses = USES if args.uses is None else args.uses
    context = min(CONTEXT if args.context is None else args.context, model.config.block_size)
    if uses < 1 or context < 2:
        raise AndreaError(f"--uses must be at least 1 and --context at least 2; got {uses} and {context}.")
    if args.layer != "all":
        try:
            parse_number(args.layer, int, 1, L)
        except ValueError:
            raise AndreaError(f"--layer takes a block from 1 to {L}, or all; got {args.layer[:40]!r}.") from None
    if not args.checkpoint and not args.data:
        raise AndreaError("--layer averages a word's hidden states over its uses in training text: give a run's "
                          "--checkpoint, or --data DIR.")
    log = None if args.json else (lambda m: print(m, file=sys.stderr))
    r = score_layers(model, tok, _run_data(args, tok, "to average the words' uses from"), sets, uses, context, args.ppmi, log=log)
    if args.layer != "all":
        keep = f"block {int(args.layer)}"
        for part in r["sets"].values():
            part["scores"] = {k: v for k, v in part["scores"].items() if k == keep or not k.startswith("block")}
    if args.json:
        print_json(r)
        return 0
    print(f"word vectors from the blocks: the hidden state after each block at a word's last token, the mean over up "
          f"to {r['uses']} uses in the training text (windows of {r['context']} tokens), centred over the {r['words']:,} "
          f"words with at least {r['min_uses']} uses; the tables: a word's token rows' mean, the table centred")
    for name, part in r["sets"].items():
        print(f"\n{name}: {part['pairs']} of {part['of']} pairs ({part['with_several_tokens']} with a word of several "
              "tokens)")
        for k, v in part["scores"].items():
            print(f"  {TABLE_NAMES.get(k, k):<24} ρ {_rho(v)}")
    return 0


def cmd_split(args) -> int:
    """One token's uses grouped by the word each began, told apart layer by layer (andrea.inside.context_vectors)."""
    from andrea.errors import AndreaError
    from andrea.inside.context_vectors import CONTEXT, SPLIT_USES, SPLIT_WORDS, split_states
    from andrea.inside.embed import load_subject

    check_source(args)
    if not args.checkpoint and not args.data:
        raise AndreaError("split reads a token's uses in training text: give a run's --checkpoint, or --data DIR.")
    subject = load_subject(args.checkpoint, args.preset, args.seed, args.tokenizer)
    model, tok = subject.model.eval(), subject.tokenizer
    token = args.token if args.token.startswith(" ") or args.bare else " " + args.token
    per_word = SPLIT_USES if args.uses is None else args.uses
    words = SPLIT_WORDS if args.words is None else args.words
    context = CONTEXT if args.context is None else args.context
    if context < 2:
        raise AndreaError(f"--context must be at least 2; got {context}.")
    data = _run_data(args, tok, "to read the token's uses from")
    log = None if args.json else (lambda m: print(m, file=sys.stderr))
    r = split_states(model, tok, data, token, per_word, words, context, log=log)
    r["model"] = subject.name
    if args.json:
        print_json(r)
        return 0
    shown = ", ".join(f"{w['word']} {w['uses']:,}" for w in r["found"])
    print(f"{r['token'].replace(' ', '␣')} (id {r['id']}) in {subject.name}: {r['uses']:,} uses in the training text; "
          f"the words it began, commonest first: {shown}")
    print(f"{r['per_word']} uses each of {', '.join(r['words'])}; the state at the token itself, in windows of "
          f"{r['context']} tokens ending there")
    print(f"\n{'layer':<10} {'between words':>14} {'named right':>12}")
    for row in r["layers"]:
        print(f"{row['layer']:<10} {row['between']:>14.3f} {100 * row['accuracy']:>11.1f}%")
    print(f"\nbetween words: the share of the states' spread between the words' means (words given at random: "
          f"{r['null']:.3f}); named right: leave-one-out nearest mean (chance {100 * r['chance']:.1f}%)")
    return 0


def print_report(r: dict) -> None:
    print(f"model: {r.get('model', '')}  (d {r['d']}; random rows at init: cos θ 0 ± {r['init_band']:.3f})")
    for name, c in r["coverage"].items():
        print(f"{name}: {c['pairs']} pairs, {c['single_token_pairs']} of them single tokens; {c['single_token_words']} of "
              f"{c['words']} words ({100 * c['single_token_words'] / max(c['words'], 1):.0f}%) single tokens in their "
              f"word-initial form")
    if r.get("standalone_rule"):
        print(f"standing alone: {r['standalone_rule']} of the run's training text (andrea.usage)")
    print("forms: " + ", ".join(f"{w} = {' + '.join(p.replace(' ', '␣') for p in ps)}" for w, ps in r["forms"].items()))
    for table, parts in r["tables"].items():
        print(f"\n{TABLE_NAMES.get(table, table)}")
        for how, s in parts.items():
            print(f"  {how}: mean cos θ between rows {s['mean_cos']:+.4f}")
            for name in ("simlex999", "wordsim353"):
                if name in s:
                    alone = f"   standing alone {_rho(s[name]['standalone'])}" if "standalone" in s[name] else ""
                    print(f"    {name:<11} ρ single tokens {_rho(s[name]['single'])}{alone}   mean-of-pieces "
                          f"{_rho(s[name]['pieces'])}   all {_rho(s[name]['all'])}")
            if "analogies" in s:
                a = s["analogies"]
                acc = "n/a" if not math.isfinite(a["accuracy"]) else f"{100 * a['accuracy']:.1f}%"
                print(f"    analogies   3CosAdd {acc} of {a['n']} single-token questions "
                      f"({a['candidates']} whole-word candidates; chance {100 / max(a['candidates'], 1):.2f}%)")
            lesson = "  ".join(f"{k} {v['cos']:+.3f}" for k, v in s["lesson"].items())
            print(f"    lesson      cos θ {lesson}")


def cmd_timeline(args) -> int:
    from andrea.errors import AndreaError
    from andrea.inside.wordsim import try_load_wordsets
    from andrea.snapshots.timeline import Timeline, pair_series, rho_series

    if len(args.words) < 2:
        raise AndreaError("give at least two words: the first is compared with each of the others.")
    tl = Timeline(args.checkpoint)
    for note in tl.notes:
        print(f"note: {note}", file=sys.stderr)
    pairs = [(args.words[0], w) for w in args.words[1:]]
    ps = pair_series(tl, pairs, args.table, centre=not args.raw)
    sets = try_load_wordsets(lambda m: print(m, file=sys.stderr))
    rs = rho_series(tl, sets, args.table, centre=not args.raw) if sets is not None else None
    index = tl.index(args.words)
    seen = {w: [] for w in args.words}
    for step in tl.steps:
        snap = tl.snapshot(step)
        for w in args.words:
            seen[w].append(int(sum(int(snap.seen[tl.position[i]]) for i in index.ids[w])))
    if args.json:
        print_json({"pairs": ps, "rho": rs, "seen": seen, "steps": tl.steps})
        return 0
    how = "raw" if args.raw else "centred"
    print(f"run: {tl.dir}  ({TABLE_NAMES[args.table]}, {how}; random rows: cos θ 0 ± {ps['band']:.3f})")
    print("forms: " + ", ".join(f"{w} = {' + '.join(p.replace(' ', '␣') for p in f)}" for w, f in ps["forms"].items()))
    head = ["step"] + [f"cos {k}" for k in ps["series"]]
    if rs is not None:
        head += [f"ρ {n} (n {s['n']})" for n, s in rs["sets"].items()]
    head += [f"seen {w}" for w in args.words]
    print("  ".join(f"{h:>14}" for h in head))
    for i, step in enumerate(tl.steps):
        cells = [f"{step:>14,}"] + [f"{v[i]:>+14.3f}" for v in ps["series"].values()]
        if rs is not None:
            cells += [f"{s['rho'][i]:>+14.3f}" if math.isfinite(s["rho"][i]) else f"{'n/a':>14}" for s in rs["sets"].values()]
        cells += [f"{seen[w][i]:>14,}" for w in args.words]
        print("  ".join(cells))
    print("seen: in how many steps' batches the word's tokens were since the snapshot before.")
    return 0


def register_embed(esub, common) -> None:
    """Add `similarity`, `split` and `timeline` to `andrea embed`."""
    s = esub.add_parser("similarity", parents=[common], help="word similarity scores: SimLex-999 and WordSim-353 ρ, "
                        "analogies, mean cosine, the lesson's pairs; optionally beside a PPMI reference",
                        description="Score the input table (wte) and the output head (lm_head), raw and with their "
                                    "mean row subtracted: Spearman ρ of cosine against human ratings on SimLex-999 "
                                    "and WordSim-353 (single-token pairs and mean-of-pieces pairs apart, with n and the "
                                    "null spread 1/√(n−1)), 3CosAdd accuracy on the Google analogies whose words are "
                                    "single tokens, the mean cosine between rows (against ±1/√d at initialisation), "
                                    "and the lesson's cat·dog against cat·Tuesday. Needs `andrea data fetch wordsets`.")
    s.add_argument("--ppmi", action="store_true", help="also score PPMI-weighted co-occurrence counts (±2 tokens, SVD "
                                                       "to d dimensions) of the run's training tokens")
    s.add_argument("--data", metavar="DIR", help="the data folder for --ppmi (default: the one the run trained on)")
    s.add_argument("--no-analogies", action="store_true", help="skip the analogy questions")
    s.add_argument("--layer", metavar="N|all", help="score word vectors from block N (or every block) instead: a "
                   "word's hidden state at its last token, averaged over its uses in the run's training text, beside "
                   "the input table, the head (and PPMI with --ppmi) on the same pairs; words of several tokens included")
    s.add_argument("--uses", type=flag_number(int, 1, 1_000_000), metavar="N", help="--layer: uses averaged per word (default: "
                   "andrea.inside.context_vectors.USES)")
    s.add_argument("--context", type=flag_number(int, 1, 65_536), metavar="T", help="--layer: tokens in each use's window, ending at the word "
                   "(default: andrea.inside.context_vectors.CONTEXT)")
    s.set_defaults(func=cmd_similarity)
    p = esub.add_parser("split", parents=[common], help="one token's uses grouped by the word each began (cat, cats, "
                        "category, …): how far the input row and each block tell the words apart",
                        description="Take the token's uses in the run's training text, name each by the word it "
                                    "began (up to the next token that starts a word), keep the commonest words and "
                                    "read the residual stream at the token itself, at the input and after each "
                                    "block. Per layer: the share of the states' spread that lies between the words "
                                    "(beside what words given at random would score) and how often a use's nearest "
                                    "word mean is its own (beside chance). The input row is the same in every word; "
                                    "a causal model sees only the words before. Example: andrea embed split cat "
                                    "--checkpoint runs/a")
    p.add_argument("token", help="the token, in its word-initial form (with the space before it) unless --bare")
    p.add_argument("--bare", action="store_true", help="look the token up as typed, without the leading space")
    p.add_argument("--data", metavar="DIR", help="the data folder to read uses from (default: the one the run trained on)")
    p.add_argument("--uses", type=flag_number(int, 1, 1_000_000), metavar="N", help="uses drawn per word (default: andrea.inside.context_vectors.SPLIT_USES)")
    p.add_argument("--words", type=flag_number(int, 1, 1_000_000), metavar="K", help="the commonest words kept (default: "
                   "andrea.inside.context_vectors.SPLIT_WORDS)")
    p.add_argument("--context", type=flag_number(int, 1, 65_536), metavar="T", help="tokens in each window, ending at the token (default: "
                   "andrea.inside.context_vectors.CONTEXT, at most the model's context)")
    p.set_defaults(func=cmd_split)
    run = argparse.ArgumentParser(add_help=False)  # a timeline is read from a run: no preset, seed or tokenizer
    run.add_argument("--checkpoint", required=True, help="a run folder (or a checkpoint in one) that kept snapshots")
    run.add_argument("--json", action="store_true", help="machine-readable output")
    t = esub.add_parser("timeline", parents=[run], help="the embedding table learning: cos θ of word pairs, ρ and "
                        "how often each word was seen, at every snapshot of a run",
                        description="Read the snapshots a run kept in embeddings/ (steps 0, 1, 2, 4, … and every "
                                    "evaluation) and print, per step, cos θ of the first word with each other word, "
                                    "Spearman ρ on SimLex-999 and WordSim-353 (when fetched), and in how many steps' "
                                    "batches each word was seen since the snapshot before. "
                                    "Example: andrea embed timeline --checkpoint runs/a cat dog Tuesday")
    t.add_argument("words", nargs="+", metavar="WORD", help="words in their word-initial form; the first is compared "
                                                             "with each of the others")
    t.add_argument("--table", choices=["input", "output"], default="input", help="input (default) or output")
    t.add_argument("--raw", action="store_true", help="cosines of the raw table (default: centred on its mean row)")
    t.set_defaults(func=cmd_timeline)
