"""`andrea lesson`: a lesson checked claim by claim on a trained model (andrea.inside.lessons)."""

from __future__ import annotations

import sys

from andrea.cli.common import print_json

WALKS = ("embedding", "attention", "block")


def cmd_lesson(args) -> int:
    # torch and numpy: loaded for this command only
    if args.walk == "attention":
        from andrea.inside.lessons import attention as walk
    elif args.walk == "block":
        from andrea.inside.lessons import block as walk
    else:
        from andrea.inside.lessons import embedding as walk

    log = None if args.json else (lambda m: print(m, file=sys.stderr))
    if args.walk in ("attention", "block"):
        inp = walk.load_inputs(args.checkpoint, log=log)
        steps = walk.lesson(inp, log=log)
    else:
        inp = walk.load_inputs(args.checkpoint, ppmi=not args.no_ppmi, log=log)
        steps = walk.lesson(inp)
    if args.json:
        print_json(walk.to_json(inp, steps))
    else:
        print(walk.to_text(inp, steps))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "lesson", help="a lesson (the embedding tables, attention, or the block), claim by claim, checked on your model",
        description="Walk a lesson's claims in order on a trained model; each step prints how it was checked, the "
                    "numbers and a verdict. embedding (the default): a row is picked by its id; the two tables and "
                    "their sizes; the rows start as N(0, 1/√d); a row moves only when its token is in the batch; "
                    "cat·dog against cat·Tuesday and cat·xylophone, with how often each word's token stands alone; "
                    "the standard similarity scores beside counting (PPMI); u·v = ‖u‖‖v‖cos θ; x_t = wte[id_t] + wpe[t]; "
                    "the untied head. attention: block 1's q·k scores on a prompt; why they are divided by √d_head; "
                    "the causal mask; the attention output rebuilt from softmax(q·k/√d)·v; what each head attends "
                    "to (previous token, first token, same token, induction); what removing each head costs on "
                    "held-out text; later tokens predicted better. block: a block rebuilt from its weights; layer norm's "
                    "rows of mean 0 and spread 1; the MLP, one position at a time, and how many of its units fire; "
                    "the residual stream each block adds to; the loss read after every block (the logit lens); what "
                    "removing each block's attention or MLP costs; the head as a table of its own, and what tying it "
                    "to the input table costs; the blocks' share of the parameters. A run folder gives every step (its snapshots, its "
                    "training data, the word sets when fetched); a bare model file gets the steps it can, and the "
                    "others say what they lack.")
    p.add_argument("walk", nargs="?", choices=WALKS, default="embedding", help="which lesson (default: embedding)")
    p.add_argument("--checkpoint", required=True, help="a run folder (as `andrea main` or `andrea train` left it) or a model file")
    p.add_argument("--no-ppmi", action="store_true",
                   help="embedding: skip the counting reference (PPMI vectors of the training text: about 10 s on "
                        "the main job's data)")
    p.add_argument("--json", action="store_true", help="machine-readable output: every step with its numbers")
    p.set_defaults(func=cmd_lesson)
