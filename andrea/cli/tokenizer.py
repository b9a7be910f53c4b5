"""`andrea tokenizer train|encode|decode|inspect|words`: the Harris tokenizer."""

from __future__ import annotations

import re
import sys
import time

from andrea.cli.common import MAX_SEGMENTS, MAX_TEXT_BYTES, read_stdin
from andrea.validate import flag_number
from andrea.errors import AndreaError

PROGRESS_BYTES = 1_000_000  # show progress bars from this much training text on
DEFAULT_SAMPLE_BYTES = 200_000_000  # andrea.tokenizer.sample.DEFAULT_SAMPLE_BYTES


MAX_SAMPLE_BYTES = 10**15  # a petabyte: more than any corpus a machine of ours holds


def _byte_count(text: str) -> int:
    """A number of bytes: 5000, 200M, 1.5G (K, M, G, T are powers of 1,000), from 1 to a petabyte;
    ASCII digits only, and a number of at most 20 characters (as `andrea.validate.parse_number`)."""
    import argparse

    m = re.fullmatch(r"\s*([0-9]{1,20}(?:\.[0-9]{1,20})?)\s*([kKmMgGtT]?)[bB]?\s*", text)
    n = int(float(m.group(1)) * 1000 ** " KMGT".index(m.group(2).upper() or " ")) if m else 0
    if not 1 <= n <= MAX_SAMPLE_BYTES:
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise argparse.ArgumentTypeError(f"{shown!r} is not a number of bytes from 1 to 1,000T (like 5000, 200M or 2G)")
    return n


def cmd_tokenizer_train(args) -> int:
    from andrea.tokenizer.sample import load_training_texts
    from andrea.tokenizer.train import train_tokenizer

    start = time.time()
    files, shares = list(args.files), None
    if args.config:
        files, shares = _curriculum_shares(args.config, files)
    if not files:
        raise AndreaError("give the text to train on: FILE... or --config with sources.")
    print(f"sampling at most {args.sample_bytes:,} bytes of training text, an equal part per source:")
    texts, weights = load_training_texts(files, shares, sample_bytes=args.sample_bytes, text_field=args.text_field,
                                         log=lambda line: print("  " + line))
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    print(f"read {len(files)} source(s): {len(texts):,} documents, {size:,} bytes")
    if shares:
        print("weighted by the curriculum's opening weights: " + ", ".join(f"{k} {v:.2f}" for k, v in shares.items()))
    reserve = [" " + w.strip() for w in args.reserve]
    tok = train_tokenizer(texts, args.segments, weights=weights, progress=size >= PROGRESS_BYTES,
                          version=args.trainer_version, reserve=reserve)
    out = tok.save(args.out)
    print(f"requested {args.segments:,} segments -> found {tok.meta['found']:,} candidates, kept {tok.n_segments:,} "
          f"(V = {tok.vocab_size:,}) in {time.time() - start:.1f} s")
    print(f"most used: {' '.join(repr(s) for s in tok.segments[:12])}")
    print(f"wrote {out}")
    return 0


def _curriculum_shares(config_path, files):
    """The sources of a training config and the weights its curriculum opens with: uniform over the
    sources (over the warm-up sources when there is a warm-up), clamped to their floors and caps."""
    from andrea.curriculum import clamp_weights
    from andrea.trainconfig import TrainConfig

    cfg = TrainConfig.load(config_path)
    if not cfg.sources:
        raise AndreaError(f"{config_path} lists no sources to weight.")
    specs = {s["name"]: s["path"] for s in cfg.sources}
    open_now = cfg.curriculum["warmup_sources"] if cfg.curriculum["warmup_steps"] > 0 and cfg.curriculum["warmup_sources"] else list(specs)
    kw = cfg.curriculum_kwargs()
    if cfg.sampling == "proportional":
        return files + [specs[n] for n in specs], None
    weights = clamp_weights({n: 1.0 / len(open_now) for n in open_now},
                            {n: f for n, f in kw["floors"].items() if n in open_now},
                            {n: c for n, c in kw["caps"].items() if n in open_now})
    return [specs[n] for n in weights], {specs[n]: w for n, w in weights.items()}


def _read_stdin() -> str:
    return read_stdin("standard input", MAX_TEXT_BYTES,
                      advice="for a larger text, `andrea prepare` writes its tokens to shards")


def _load(args):
    from andrea.tokenizer.harris import HarrisTokenizer

    return HarrisTokenizer.load(args.tokenizer)


def cmd_tokenizer_encode(args) -> int:
    tok = _load(args)
    text = args.text if args.text is not None else _read_stdin()
    ids = tok.encode(text, bos=not args.no_bos)
    if args.pieces:
        print(" ".join(repr(tok.segment_label(i)) for i in ids))
    else:
        print(" ".join(map(str, ids)))
    return 0


def cmd_tokenizer_decode(args) -> int:
    tok = _load(args)
    words = args.ids if args.ids else re.split(r"[\s,\[\]]+", _read_stdin())
    ids = []
    for w in words:
        if not w:
            continue
        try:
            ids.append(int(w))
        except ValueError:
            raise AndreaError(f"{w!r} is not a token id (a whole number).") from None
    out = tok.decode(ids).encode("utf-8", "surrogatepass")  # the exact text, lone surrogates too
    sys.stdout.flush()
    sys.stdout.buffer.write(out)
    sys.stdout.flush()
    return 0


def cmd_tokenizer_inspect(args) -> int:
    from andrea.tokenizer.train import successor_variety

    tok = _load(args)
    stats = successor_variety(tok)
    if stats is None:
        print("this tokenizer has no successor-variety statistics saved with it (a bare harris_segments.json), "
              "so only the encodings are shown.\n")
    known_words = set(stats.words) if stats is not None else set()
    for word in args.words:
        print(word)
        if stats is not None:
            low = word.lower()
            known = "a word type" if low in known_words else "not a word type"
            print(f"  successor variety over {len(stats.words):,} word types ({low!r} is {known} of the corpus):")
            sv_peaks, pv_peaks = stats.peaks(low)
            cuts = set(sv_peaks) | set(pv_peaks)
            w = max(len(low), 6)
            print(f"    {'prefix':>{w}} | {'suffix':<{w}}  SV  PV")
            for prefix, sv, pv in stats.profile(low):
                i = len(prefix)
                why = " and ".join(name for name, at in (("SV", sv_peaks), ("PV", pv_peaks)) if i in at)
                mark = f"  <- boundary ({why} peak)" if why else ""
                print(f"    {prefix:>{w}} | {low[i:]:<{w}} {sv:>3} {pv:>3}{mark}")
            bounds = [0, *sorted(cuts), len(low)]
            print(f"  boundaries: {'|'.join(low[i:j] for i, j in zip(bounds, bounds[1:]))}")
        for form in (word, " " + word):
            ids = tok.encode(form, bos=False)
            pieces = " ".join(repr(tok.segment_label(i)) for i in ids)
            print(f"  {form!r:<{len(word) + 4}} -> {pieces}   ids {' '.join(map(str, ids))}")
        print()
    return 0


def cmd_tokenizer_words(args) -> int:
    import json

    from andrea.tokenizer.sample import load_training_texts
    from andrea.tokenizer.train import count_words
    from andrea.tokenizer.words import PURE, word_tokens

    tok = _load(args)
    texts, _ = load_training_texts(args.text, sample_bytes=args.sample_bytes)
    report = word_tokens(tok, count_words(texts))
    words = [report.word(tok, w) for w in (args.words or ["cat", "dog", "pet", "Tuesday"])]
    summary = report.summary(tok)
    if args.json:
        print(json.dumps({"words": words, "summary": summary}, indent=2, ensure_ascii=False))
        return 0
    print(f"over {sum(report.word_counts.values()):,} words of text ({len(report.word_counts):,} distinct):")
    for r in words:
        cov = "never seen" if r["coverage"] is None else f"coverage {r['coverage']:.0%} of {r['occurrences']:,}"
        if r["purity"] is None:
            print(f"  {r['word']}: {len(r['ids'])} tokens ({'+'.join(r['tokens'])}); {cov}")
        else:
            print(f"  {r['word']}: {r['tokens'][0]!r}, purity {r['purity']:.0%} of {r['uses']:,} uses; {cov}")
    if summary["word_tokens"]:
        print(f"tokens that stand for a word (the whole word in {summary['min_uses']}+ uses): {summary['word_tokens']:,}; "
              f"pure (the whole word in {PURE:.0%}+ of their uses): {summary['pure']:,} ({summary['pure_share']:.0%}), "
              f"{summary['uses_pure_share']:.0%} of their uses")
        print("least pure: " + ", ".join(f"{r['token']!r} {r['purity']:.0%} of {r['uses']:,}" for r in summary["least_pure"][:5]))
    return 0


def _add_tokenizer_arg(p) -> None:
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="a folder written by `andrea tokenizer train` (or a harris_segments.json file)")


def register(sub) -> None:
    from andrea.mainjob_settings import MAIN_SEGMENTS
    from andrea.tokenizer.train import TRAINER_VERSION, TRAINER_VERSIONS

    p = sub.add_parser("tokenizer", help="the Harris tokenizer: train, encode, decode, inspect, words")
    tsub = p.add_subparsers(dest="tokenizer_command", metavar="ACTION", required=True)

    t = tsub.add_parser("train", help="find segments by successor variety and save the tokenizer",
                        description="Count successor variety over the words of the given text, cut words where it "
                                    "peaks, and keep the N segments that save the most tokens. Writes "
                                    "harris_segments.json, tokenizer.json and harris_words.txt.gz into --out.")
    t.add_argument("--config", metavar="FILE", help="a training config: train on its sources, weighted as its "
                   "curriculum opens (uniform, or the warm-up sources, within floors and caps)")
    t.add_argument("files", nargs="*", metavar="FILE",
                   help="a source: a .txt, .jsonl or .parquet file (.gz and .zst compressed too), a folder of them, "
                        "or a fetched source by name (`andrea data list` names them: chitchat, brown, big-txt, austen, sotu, ...)")
    t.add_argument("--sample-bytes", type=_byte_count, default=DEFAULT_SAMPLE_BYTES, metavar="N",
                   help="fit on at most about N bytes of training text over all sources, an equal part each, drawn "
                        "evenly and deterministically across each source's files (default 200M; K, M, G suffixes)")
    t.add_argument("--text-field", default="text", metavar="NAME",
                   help="the JSONL field or parquet column that holds the text (default text)")
    t.add_argument("--segments", type=flag_number(int, 1, MAX_SEGMENTS), default=MAIN_SEGMENTS, metavar="N",
                   help=f"how many segments (default {MAIN_SEGMENTS:,}, V = {MAIN_SEGMENTS + 257:,}, as the main job; "
                        "andrea-12m uses 2,048)")
    t.add_argument("--trainer-version", type=flag_number(int, min(TRAINER_VERSIONS), max(TRAINER_VERSIONS)), choices=TRAINER_VERSIONS, default=TRAINER_VERSION, metavar="V",
                   help="how segments are selected: 5 (default) marks word ends, so that a whole word's token (' cat</w>') "
                        "is that word alone and the plain ' cat' only begins longer words; 4 scores a segment by what "
                        "its absence really costs, a one-character segment of several bytes ('—', '’') at its bytes; "
                        "3 reproduces earlier releases, which dropped such segments first")
    t.add_argument("--reserve", nargs="+", default=[], metavar="WORD",
                   help="version 5: words whose word ends are kept whatever they save (the main job reserves the "
                        "lesson's cat, dog, pet and Tuesday)")
    t.add_argument("--out", required=True, metavar="DIR", help="the folder to write the tokenizer into")
    t.set_defaults(func=cmd_tokenizer_train)

    e = tsub.add_parser("encode", help="print the token ids of a text",
                        description="Encode TEXT, or standard input when no TEXT is given, exactly as it is.")
    _add_tokenizer_arg(e)
    e.add_argument("text", nargs="?", metavar="TEXT", help="the text (default: standard input)")
    e.add_argument("--no-bos", action="store_true", help="leave out the BOS id (256) in front")
    e.add_argument("--pieces", action="store_true", help="print readable pieces instead of ids")
    e.set_defaults(func=cmd_tokenizer_encode)

    d = tsub.add_parser("decode", help="print the text of token ids",
                        description="Decode the ids (or those on standard input) and write the text exactly, "
                                    "without adding a newline.")
    _add_tokenizer_arg(d)
    d.add_argument("ids", nargs="*", metavar="ID", help="token ids (default: read from standard input)")
    d.set_defaults(func=cmd_tokenizer_decode)

    i = tsub.add_parser("inspect", help="show how words are cut: successor variety, boundaries, segments",
                        description="For each WORD: the successor variety (SV) of each prefix and predecessor "
                                    "variety (PV) of each suffix over the training corpus's word types, the "
                                    "boundaries where they peak, and the segments the word encodes to.")
    _add_tokenizer_arg(i)
    i.add_argument("words", nargs="+", metavar="WORD")
    i.set_defaults(func=cmd_tokenizer_inspect)

    w = tsub.add_parser("words", help="purity and coverage of word tokens on a text",
                        description="Over the words of the given text: for each WORD, its token after a space, the "
                                    "share of that token's uses in which it is the whole word (purity) and the share "
                                    "of the word's occurrences encoded as one token (coverage); then how many of the "
                                    "tokens that stand for a word are pure (andrea.tokenizer.words).")
    _add_tokenizer_arg(w)
    w.add_argument("--text", nargs="+", required=True, metavar="FILE",
                   help="the text to count on: files, folders or fetched sources by name, as `train` takes them")
    w.add_argument("--sample-bytes", type=_byte_count, default=DEFAULT_SAMPLE_BYTES, metavar="N",
                   help="count on at most about N bytes, an equal part per source (default 200M)")
    w.add_argument("words", nargs="*", metavar="WORD", help="words to report (default: cat dog pet Tuesday)")
    w.add_argument("--json", action="store_true", help="print the figures as JSON")
    w.set_defaults(func=cmd_tokenizer_words)
