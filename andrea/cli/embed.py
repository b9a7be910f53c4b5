"""`andrea embed ...`: look inside the embedding layer (the tables, rows, similarities, positions)
and at what the blocks do with a prompt (attention, the logit lens)."""

from __future__ import annotations

import argparse
from pathlib import Path

from andrea.cli.common import check_source, print_json
from andrea.validate import MAX_SEED, flag_number, parse_number


def _subject(args, meta: bool = False):
    from andrea.inside.embed import load_subject

    check_source(args)
    return load_subject(args.checkpoint, args.preset, args.seed, args.tokenizer, meta=meta)


def _png_path(args, subject, what: str) -> Path:
    return Path(args.png) if args.png else Path.cwd() / f"embed-{what}-{subject.slug}.png"


def _header(subject, lookups: bool = True) -> None:
    print(f"model: {subject.name}")
    if lookups and subject.tokenizer_note:
        print(f"note: {subject.tokenizer_note}")


def _describe(lk: dict) -> str:
    from andrea.inside.embed import FORM_NOTES, show_piece

    form = "" if lk["form"] in ("id", "as typed") else f" ({FORM_NOTES[lk['form']]})"
    if lk["single"]:
        return f"{lk['query']!r} → token {lk['ids'][0]} {show_piece(lk['pieces'][0])}{form}"
    return (f"{lk['query']!r} → {show_piece(lk['text'])}{form}, mean of {len(lk['ids'])} tokens "
            + " + ".join(show_piece(p) for p in lk["pieces"]))


def _notes(*lks: dict) -> None:
    for lk in lks:
        if lk["note"]:
            print(f"note: {lk['note']}")


# ---------------------------------------------------------------- embed table


def cmd_table(args) -> int:
    from andrea.inside.embed import parameter_groups
    from andrea.plots import plot_parameter_groups

    subject = _subject(args, meta=True)
    groups = parameter_groups(subject.model)
    png = plot_parameter_groups(groups, _png_path(args, subject, "table"), subject.name)
    if args.json:
        print_json({"model": subject.name, "png": str(png),
                    "rows": [{"name": g.name, "shape": g.shape, "count": g.count, "share": g.share} for g in groups]})
        return 0
    _header(subject, lookups=False)
    w, ws = max(len(g.name) for g in groups), max(len(g.shape) for g in groups)
    wc = max(len(f"{g.count:,}") for g in groups)
    print(f"{'component':<{w}}  {'shape':<{ws}}  {'parameters':>{wc}}  {'share':>7}")
    for g in groups:
        if g.name in ("transformer blocks", "total"):
            print("-" * (w + ws + wc + 13))
        print(f"{g.name:<{w}}  {g.shape:<{ws}}  {g.count:>{wc},}  {100 * g.share:6.2f}%")
    print(f"picture: {png}")
    return 0


# ---------------------------------------------------------------- embed show


def cmd_show(args) -> int:
    from andrea.inside.embed import show_piece, show_tokens

    subject = _subject(args)
    rows = show_tokens(subject.model, subject.tokenizer, args.text, args.values)
    if args.json:
        print_json({"model": subject.name, "text": args.text, "tokens": rows})
        return 0
    _header(subject)
    print(f"{args.text!r} → {len(rows)} token{'s' if len(rows) != 1 else ''}")
    wp = max(5, *(len(show_piece(r["piece"])) for r in rows))
    print(f"{'id':>6}  {'kind':<8}  {'piece':<{wp}}  {'‖wte row‖':>9}  {'‖head row‖':>10}  first {args.values} values of the wte row")
    for r in rows:
        kind = "byte*" if r["kind"] == "byte" else r["kind"]
        values = " ".join(f"{v:+.3f}" for v in r["values"])
        print(f"{r['id']:>6}  {kind:<8}  {show_piece(r['piece']):<{wp}}  {r['norm']:>9.4f}  {r['head_norm']:>10.4f}  {values}")
    if any(r["kind"] == "byte" for r in rows):
        print("* byte fallback: where no segment matches, the text is spelled as raw UTF-8 bytes (ids 0-255).")
    return 0


# ---------------------------------------------------------------- embed compare


def cmd_compare(args) -> int:
    from andrea.inside.embed import compare

    subject = _subject(args)
    r = compare(subject.model, subject.tokenizer, args.a, args.b, bare=args.bare)
    if args.json:
        print_json({"model": subject.name, **r})
        return 0
    _header(subject)
    print(f"u: {_describe(r['a'])}")
    print(f"v: {_describe(r['b'])}")
    _notes(r["a"], r["b"])
    print(f"{'':<12}  {'input (wte)':>14}  {'output (lm_head)':>16}")
    for key, label, fmt in (("norm_u", "‖u‖", ".4f"), ("norm_v", "‖v‖", ".4f"), ("dot", "u·v", "+.4f"),
                            ("cos", "cos θ", "+.4f"), ("angle_deg", "θ (degrees)", ".2f")):
        print(f"{label:<12}  {format(r['input'][key], fmt):>14}  {format(r['output'][key], fmt):>16}")
    print("u·v = ‖u‖ ‖v‖ cos θ; the input table and the output head are separate (untied) matrices.")
    return 0


# ---------------------------------------------------------------- embed neighbours


def cmd_neighbours(args) -> int:
    import sys

    from andrea.inside.embed import neighbours, show_piece
    from andrea.usage import run_usage

    subject = _subject(args)
    usage, why = run_usage(subject.checkpoint, subject.tokenizer, log=lambda m: print(m, file=sys.stderr))
    r = neighbours(subject.model, subject.tokenizer, args.word, args.k, args.metric, args.table, args.bare,
                   args.whole_words, usage)
    if args.json:
        print_json({"model": subject.name, **r, "usage_unknown": why or None})
        return 0
    _header(subject)
    _notes(r["word"])
    if r.get("usage_line"):
        print(r["usage_line"])
    name = "input table (wte)" if args.table == "input" else "output head (lm_head)"
    by = "cos θ" if args.metric == "cos" else "dot product u·v"
    among = f", among whole words ({r['whole_words_rule']})" if args.whole_words else ""
    print(f"nearest to {_describe(r['word'])}, in the {name}{among}, by {by} (row norm {r['norm']:.4f}):")
    for rank, n in enumerate(r["neighbours"], 1):
        alone = n.get("standalone_share")
        tail = "" if "standalone_share" not in n else "  (never seen)" if alone is None else f"  (alone in {alone:.0%} of uses)"
        print(f"{rank:>4}  {n['id']:>6}  {show_piece(n['piece']):<20}  {n['score']:+.4f}{tail}")
    if why and args.whole_words:
        print(f"note: whole words here are tokens of a space and letters; how each is used is unknown ({why}).")
    return 0


# ---------------------------------------------------------------- embed positions


def cmd_positions(args) -> int:
    from andrea.inside.embed import positions
    from andrea.plots import plot_position_similarity

    subject = _subject(args)
    r = positions(subject.model)
    png = None
    if r["table"] is not None:
        title = f"{subject.name}: {r['table']} position table ({r['positions']} × {subject.model.config.n_embd})"
        png = plot_position_similarity(r["similarity"], r["similarity_at"], _png_path(args, subject, "positions"), title)
    if args.json:
        print_json({"model": subject.name, **{k: v for k, v in r.items() if k != "similarity"},
                    "png": str(png) if png else None})
        return 0
    _header(subject)
    print(r["note"])
    if r["table"] is None:
        print("no picture: there is no position table to compare.")
        return 0
    print(f"{r['table']} table: {r['positions']} positions, mean row norm {r['norm_mean']:.4f}")
    print("mean cos θ between positions t and t + k:")
    for k, v in r["similarity_at"].items():
        print(f"  k = {k:>4}  {v:+.4f}")
    print(f"picture: {png}")
    return 0


# ---------------------------------------------------------------- embed map


def cmd_map(args) -> int:
    from andrea.errors import AndreaError
    from andrea.inside.embed import map_points
    from andrea.plots import plot_map

    if args.words and args.top:
        raise AndreaError("give either words or --top N, not both.")
    if not args.words and not args.top:
        raise AndreaError("give the words to map, or --top N for the N most used segments.")
    subject = _subject(args)
    r = map_points(subject.model, subject.tokenizer, args.words, args.top, args.table, args.bare, args.method)
    what = f"{len(r['points'])} chosen tokens" if args.words else f"the {len(r['points'])} most used segments"
    table_name = "input table (wte)" if args.table == "input" else "output head (lm_head)"
    how = "first two principal components" if args.method == "pca" else "t-SNE (axes carry no meaning)"
    png = plot_map(r["points"], r["explained"], _png_path(args, subject, "map"), f"{subject.name}\n{what}, {table_name}, {how}")
    if args.json:
        print_json({"model": subject.name, **r, "png": str(png)})
        return 0
    _header(subject)
    for p in r["points"]:
        if p["note"]:
            print(f"note: {p['note']}")
    if args.method == "pca":
        print(f"PCA of {what} in the {table_name}: PC 1 explains {100 * r['explained'][0]:.1f}% of the variance, "
              f"PC 2 {100 * r['explained'][1]:.1f}%")
    else:
        print(f"t-SNE of {what} in the {table_name} (near points are near neighbours; the axes carry no meaning)")
    for p in r["points"]:
        print(f"  {p['label']:<24} {p['x']:+8.4f} {p['y']:+8.4f}")
    print(f"picture: {png}")
    return 0


# ---------------------------------------------------------------- embed forward


def cmd_forward(args) -> int:
    import numpy as np

    from andrea.errors import AndreaError
    from andrea.inside.embed import forward_matrix, show_piece

    subject = _subject(args)
    if args.text == "":
        raise AndreaError("give some text to embed; it is empty.")
    ids = subject.tokenizer.encode(args.text, bos=not args.no_bos)
    r = forward_matrix(subject.model, ids)
    pieces = [subject.tokenizer.id_to_piece(i) for i in ids]
    norms = {k: np.linalg.norm(r[k], axis=1) for k in ("token_part", "position_part", "x")}
    if args.save:  # written to exactly the path given (np.save on a name would add .npy to it)
        from andrea.files import atomic_output

        with atomic_output(args.save) as tmp, open(tmp, "wb") as f:
            np.save(f, r["x"].astype(np.float32))
    rows = [{"t": t, "id": i, "piece": p, "token_norm": float(norms["token_part"][t]),
             "position_norm": float(norms["position_part"][t]), "sum_norm": float(norms["x"][t])}
            for t, (i, p) in enumerate(zip(ids, pieces))]
    T, d = r["x"].shape
    if args.json:
        print_json({"model": subject.name, "shape": [T, d], "rows": rows, "saved": args.save})
        return 0
    _header(subject)
    pos = subject.model.config.pos
    formula = {"learned": "wte[ids] + wpe[0:T]", "sinusoidal": "wte[ids] + PE[0:T] (the fixed sinusoidal table)",
               "rope": "wte[ids] (rope adds nothing here; it rotates q and k inside attention)",
               "none": "wte[ids] (no position scheme)"}[pos]
    print(f"x = {formula}: a {T} × {d} matrix enters block 1")
    wp = max(5, *(len(show_piece(p)) for p in pieces))
    print(f"{'t':>4}  {'id':>6}  {'token':<{wp}}  {'‖token part‖':>12}  {'‖position part‖':>15}  {'‖sum‖':>8}")
    for row in rows:
        print(f"{row['t']:>4}  {row['id']:>6}  {show_piece(row['piece']):<{wp}}  {row['token_norm']:>12.4f}  "
              f"{row['position_norm']:>15.4f}  {row['sum_norm']:>8.4f}")
    if args.save:
        print(f"saved x ({T} × {d}, float32) to {args.save}")
    return 0


# ---------------------------------------------------------------- embed attention


def attention_json(r: dict) -> dict:
    """The attention result as JSON: patterns as nested lists [layer][head][query][key]."""
    return {"ids": r["ids"], "pieces": r["pieces"], "layers": r["layers"], "heads": r["heads"],
            "patterns": r["patterns"].round(6).tolist()}


def cmd_attention(args) -> int:
    from andrea.inside.blocks import attention
    from andrea.inside.embed import show_piece

    subject = _subject(args)
    r = attention(subject.model, subject.tokenizer, args.text, bos=not args.no_bos)
    if args.json:
        print_json({"model": subject.name, **attention_json(r)})
        return 0
    _header(subject)
    labels = [f"{t}:{show_piece(p)}" for t, p in enumerate(r["pieces"])]
    w = max(len(x) for x in labels)
    print(f"{len(labels)} tokens, {r['layers']} layers × {r['heads']} heads; row i: how much position i attends to "
          "each position j <= i, in percent (rows sum to 100)")
    layers = args.layers_shown or list(range(r["layers"]))
    heads = args.head or list(range(r["heads"]))
    for v, what, n in [(v, "layer", r["layers"]) for v in layers] + [(v, "head", r["heads"]) for v in heads]:
        if v >= n:
            from andrea.errors import AndreaError

            raise AndreaError(f"there is no {what} {v + 1}: the model has {n} {what}s.")
    for layer in range(r["layers"]):
        for head in range(r["heads"]):
            if layer in layers and head in heads:
                print(f"\nlayer {layer + 1}, head {head + 1}")
                print(" " * w + "  " + " ".join(f"{t:>4}" for t in range(len(labels))))
                for i, lab in enumerate(labels):
                    row = r["patterns"][layer, head, i]
                    print(f"{lab:<{w}}  " + " ".join(f"{100 * row[j]:>4.0f}" if j <= i else "   ." for j in range(len(labels))))
    return 0


# ---------------------------------------------------------------- embed lens


def cmd_lens(args) -> int:
    from andrea.inside.blocks import logit_lens
    from andrea.inside.embed import show_piece

    subject = _subject(args)
    r = logit_lens(subject.model, subject.tokenizer, args.text, args.k, bos=not args.no_bos)
    if args.json:
        print_json({"model": subject.name, **r})
        return 0
    _header(subject)
    print("the logit lens: the final norm and the head applied to the residual stream after each stage; "
          f"the top {args.k} next-token predictions at each position (probability in percent)")
    for t, piece in enumerate(r["pieces"]):
        nxt = f", next in the prompt: {show_piece(r['pieces'][t + 1])}" if t + 1 < len(r["pieces"]) else ""
        print(f"\nposition {t}: {show_piece(piece)}{nxt}")
        for stage, row in zip(r["stages"], r["lens"]):
            cell = row[t]
            preds = "  ".join(f"{show_piece(p['piece'])} {100 * p['prob']:.1f}" for p in cell["top"])
            own = f"   (next: {100 * cell['next_prob']:.1f})" if cell["next_prob"] is not None else ""
            print(f"  {stage:<10} {preds}{own}")
    return 0


# ---------------------------------------------------------------- embed export


def cmd_export(args) -> int:
    from andrea.formats.projector import write_projector

    subject = _subject(args)
    vectors, meta = write_projector(args.projector, subject.model, subject.tokenizer, args.table)
    V, d = subject.model.config.vocab_size, subject.model.config.n_embd
    if args.json:
        print_json({"model": subject.name, "vectors": str(vectors), "metadata": str(meta), "rows": V, "dim": d})
        return 0
    _header(subject)
    print(f"wrote {vectors} ({V:,} rows × {d}) and {meta} (piece, id, kind)")
    print("load both at https://projector.tensorflow.org (Load → Choose file)")
    return 0


# ---------------------------------------------------------------- registration


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--checkpoint", help="a checkpoint file or run folder")
    p.add_argument("--preset", help="inspect a freshly initialised model of this preset instead")
    p.add_argument("--seed", type=flag_number(int, 0, MAX_SEED), default=0, help="seed of the fresh model's initialisation (default 0)")
    p.add_argument("--tokenizer", help="a tokenizer folder for word lookups (a checkpoint brings its own; without "
                                       "one, text is looked up as bytes and tokens as #ID)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


WORD_HELP = ("a word, looked up in its word-initial form (with the leading space it has in running text) unless "
             "--bare; text starting with a space is looked up as typed; #ID names a token; a text of several tokens "
             "stands for the mean of their rows")
BARE_HELP = "look words up as the bare piece typed, without the leading space a word has in running text"


def _layers(value: str) -> list[int]:
    """Layers or heads counted from 1, comma-separated: each read by `andrea.validate.parse_number`."""
    try:
        return [parse_number(v, int, 1, 100_000) - 1 for v in value.split(",")]
    except ValueError:
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise argparse.ArgumentTypeError(f"expected numbers from 1 to 100,000 separated by commas, got {shown!r}") from None


def register(sub) -> None:
    common = _common()
    p = sub.add_parser("embed", help="look inside the embedding layer: tables, rows, similarities, positions",
                       description="Inspect the token embedding (wte), the position embedding (wpe) and the untied "
                                   "output head (lm_head) of a checkpoint or a freshly initialised preset, and what "
                                   "the blocks do with a prompt (attention, the logit lens). `andrea lab` shows the "
                                   "same in a browser.")
    esub = p.add_subparsers(dest="embed_command", metavar="ACTION", required=True)
    _register_tables(esub, common)
    _register_prompts(esub, common)
    from andrea.cli.similarity import register_embed

    register_embed(esub, common)


def _register_tables(esub, common) -> None:
    """The commands that read the tables: table, show, compare, neighbours, positions, map, export."""
    t = esub.add_parser("table", parents=[common], help="where the parameters live, as a table and a chart")
    t.add_argument("--png", help="the chart's file (default embed-table-<model>.png in the current folder)")
    t.set_defaults(func=cmd_table)

    s = esub.add_parser("show", parents=[common], help="each token of a text: id, piece, row norm, first values")
    s.add_argument("text")
    s.add_argument("--values", type=flag_number(int, 0, 4_096), default=6, help="how many leading values of each row to print (default 6)")
    s.set_defaults(func=cmd_show)

    c = esub.add_parser("compare", parents=[common], help="‖u‖, ‖v‖, u·v, cos θ and θ of two tokens or words, "
                        "in the input table and in the output head")
    c.add_argument("a", help=WORD_HELP)
    c.add_argument("b", help=WORD_HELP)
    c.add_argument("--bare", action="store_true", help=BARE_HELP)
    c.set_defaults(func=cmd_compare)

    n = esub.add_parser("neighbors", aliases=["neighbours"], parents=[common], help="the tokens nearest to a token or word")
    n.add_argument("word", help=WORD_HELP)
    n.add_argument("-k", type=flag_number(int, 1, 100_000), default=10, help="how many (default 10)")
    n.add_argument("--metric", choices=["cos", "dot"], default="cos", help="cos θ (default) or the dot product")
    n.add_argument("--table", choices=["input", "output"], default="input",
                   help="the input table wte (default) or the output head lm_head")
    n.add_argument("--bare", action="store_true", help=BARE_HELP)
    n.add_argument("--whole-words", action="store_true",
                   help="list only whole-word tokens (a space followed by letters), not pieces, bytes or punctuation")
    n.set_defaults(func=cmd_neighbours)

    po = esub.add_parser("positions", parents=[common], help="similarity between positions, as a heatmap and figures")
    po.add_argument("--png", help="the heatmap's file (default embed-positions-<model>.png in the current folder)")
    po.set_defaults(func=cmd_positions)

    m = esub.add_parser("map", parents=[common], help="a 2-D map (PCA or t-SNE) of chosen tokens or the most used ones, labelled")
    m.add_argument("words", nargs="*", metavar="WORD", help=WORD_HELP)
    m.add_argument("--top", type=flag_number(int, 1, 1_000_000), help="map the N most used segments instead of chosen words")
    m.add_argument("--table", choices=["input", "output"], default="input", help="input (default) or output")
    m.add_argument("--method", choices=["pca", "tsne"], default="pca",
                   help="pca (default: a linear projection) or tsne (scikit-learn's t-SNE: keeps near neighbours near)")
    m.add_argument("--bare", action="store_true", help=BARE_HELP)
    m.add_argument("--png", help="the picture's file (default embed-map-<model>.png in the current folder)")
    m.set_defaults(func=cmd_map)

    e = esub.add_parser("export", parents=[common], help="vectors.tsv and metadata.tsv for the TensorFlow Embedding Projector")
    e.add_argument("--projector", required=True, metavar="DIR", help="the folder to write the two files to")
    e.add_argument("--table", choices=["input", "output"], default="input", help="input (default) or output")
    e.set_defaults(func=cmd_export)


def _register_prompts(esub, common) -> None:
    """The commands that run a prompt through the model: forward, attention, lens."""
    f = esub.add_parser("forward", parents=[common], help="the matrix x = wte[ids] + wpe[0:T] that enters block 1")
    f.add_argument("text")
    f.add_argument("--no-bos", action="store_true", help="leave out the BOS token every document starts with")
    f.add_argument("--save", metavar="FILE.npy", help="write x (T × d, float32) to a .npy file")
    f.set_defaults(func=cmd_forward)

    a = esub.add_parser("attention", parents=[common], help="every layer's and head's attention pattern on a prompt",
                        description="The attention weights of every layer and head on a prompt (BOS first): row i "
                                    "says how much position i attends to each earlier position j.")
    a.add_argument("text", help="the prompt")
    a.add_argument("--no-bos", action="store_true", help="leave out the BOS token every document starts with")
    a.add_argument("--layer", dest="layers_shown", type=_layers, help="layers to print, from 1, comma-separated "
                   "(default all; --json always holds all)")
    a.add_argument("--head", type=_layers, help="heads to print, from 1, comma-separated (default all)")
    a.set_defaults(func=cmd_attention)

    ln = esub.add_parser("lens", parents=[common], help="the logit lens: top predictions after each block",
                         description="Apply the final norm and the head to the residual stream after the embedding "
                                     "and after each block, and print the top predictions at each position of a "
                                     "prompt. After the last block this is the model's own prediction.")
    ln.add_argument("text", help="the prompt")
    ln.add_argument("-k", type=flag_number(int, 1, 100_000), default=3, help="predictions per stage and position (default 3)")
    ln.add_argument("--no-bos", action="store_true", help="leave out the BOS token every document starts with")
    ln.set_defaults(func=cmd_lens)
