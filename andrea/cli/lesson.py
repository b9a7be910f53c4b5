"""`andrea lesson`: the embedding lesson checked claim by claim on a trained model (andrea.lesson)."""

from __future__ import annotations

import sys

from andrea.cli.common import print_json


def cmd_lesson(args) -> int:
    from andrea.lesson import lesson, load_inputs, to_json, to_text  # torch and numpy: loaded for this command only

    log = None if args.json else (lambda m: print(m, file=sys.stderr))
    inp = load_inputs(args.checkpoint, ppmi=not args.no_ppmi, log=log)
    steps = lesson(inp)
    if args.json:
        print_json(to_json(inp, steps))
    else:
        print(to_text(inp, steps))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "lesson", help="the embedding lesson, claim by claim, checked on your model",
        description="Walk the lesson's claims in order on a trained model: a row is picked by its id; the two tables "
                    "and their sizes; the rows start as N(0, 1/√d); a row moves only when its token is in the batch; "
                    "cat·dog against cat·Tuesday and cat·xylophone, with how often each word's token stands alone; "
                    "the standard similarity scores beside counting (PPMI); u·v = ‖u‖‖v‖cos θ; x_t = wte[id_t] + wpe[t]; "
                    "the untied head. Each step prints how it was checked, the numbers and a verdict. A run folder "
                    "gives every step (its snapshots, its training data, the word sets when fetched); a bare model "
                    "file gets the steps it can, and the others say what they lack.")
    p.add_argument("--checkpoint", required=True, help="a run folder (as `andrea main` or `andrea train` left it) or a model file")
    p.add_argument("--no-ppmi", action="store_true",
                   help="skip the counting reference (PPMI vectors of the training text: about 10 s on the main job's data)")
    p.add_argument("--json", action="store_true", help="machine-readable output: every step with its numbers")
    p.set_defaults(func=cmd_lesson)
