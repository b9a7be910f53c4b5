"""`andrea experiment positions` and `andrea experiment sparse-updates`: experiments that train
small models side by side and compare them (`andrea.experiments`)."""

from __future__ import annotations

from pathlib import Path

from andrea.cli.common import print_json
from andrea.validate import MAX_SEED, flag_number


def cmd_experiment_positions(args) -> int:
    import sys

    from andrea.experiments.positions import PositionsExperiment, default_data_dir, run_positions_experiment

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    data = args.data or default_data_dir()
    exp = PositionsExperiment(data_dir=Path(data), out_dir=Path(args.out), preset=args.preset, steps=args.steps,
                              seq_len=args.seq_len, batch_size=args.batch_size, seed=args.seed, lr=args.lr)
    # progress goes to stderr, so stdout holds only the result (the table, or JSON)
    result = run_positions_experiment(exp, log=lambda msg: print(msg, file=sys.stderr), progress=not args.no_progress)
    if args.json:
        print_json(result["summary"])
        return 0
    print(result["markdown"])
    print(f"table: {result['markdown_path']}")
    print(f"picture: {result['png']}")
    return 0


def cmd_experiment_sparse_updates(args) -> int:
    import sys

    from andrea.experiments.sparse_updates import SparseUpdatesExperiment, sparse_updates, write_results

    exp = SparseUpdatesExperiment(data_dir=Path(args.data) if args.data else None, steps=args.steps, seed=args.seed)
    summary = sparse_updates(exp, log=lambda msg: print(msg, file=sys.stderr))
    result = write_results(summary, args.out)
    if args.json:
        print_json(summary)
        return 0
    print(result["markdown"])
    print(f"table: {result['markdown_path']}")
    print(f"picture: {result['png']}")
    return 0


def register(sub) -> None:
    x = sub.add_parser("experiment", help="experiments that train small models and compare them")
    xsub = x.add_subparsers(dest="experiment_command", metavar="EXPERIMENT", required=True)
    xp = xsub.add_parser("positions", help="learned vs sinusoidal vs rope vs no positions, on the same data",
                         description="Train four models that differ only in their position scheme on identical data, "
                                     "steps and seed; report validation bits per byte, the same on shuffled text, "
                                     "and the loss at positions beyond the trained length. Writes positions.md, "
                                     "positions.json and positions.png to --out.")
    xp.add_argument("--data", help="a folder made by `andrea prepare` (default: the main job's cached data)")
    xp.add_argument("--out", default="runs/positions", help="where to write runs and results (default runs/positions)")
    xp.add_argument("--preset", default="andrea-tiny", help="model shape (default andrea-tiny); V comes from the data")
    xp.add_argument("--steps", type=flag_number(int, 1, 10_000_000), default=200, help="training steps per model (default 200; scale up for "
                                                           "clearer differences)")
    xp.add_argument("--seq-len", type=flag_number(int, 1, 65_536), default=64, help="training length S; models get a context of 2S (default 64)")
    xp.add_argument("--batch-size", type=flag_number(int, 1, 65_536), default=16, help="sequences per step (default 16)")
    xp.add_argument("--lr", type=flag_number(float, 0, 10, lo_open=True), default=2e-3, help="peak learning rate (default 2e-3)")
    xp.add_argument("--seed", type=flag_number(int, 0, MAX_SEED), default=1337, help="one seed for all four runs (default 1337)")
    xp.add_argument("--threads", type=flag_number(int, 1, 4_096), help="CPU threads for torch (default: torch's choice; on a machine "
                                                "shared with other jobs, 1 can be several times faster)")
    xp.add_argument("--no-progress", action="store_true", help="no progress bars")
    xp.add_argument("--json", action="store_true", help="machine-readable output")
    xp.set_defaults(func=cmd_experiment_positions)

    xs = xsub.add_parser("sparse-updates", help="which rows of the embedding table move at a step whose batch lacks "
                                                "their token, under SGD, Adam, AdamW and v3",
                         description="Train the same small model on the same batches with SGD, Adam (v1), AdamW (v2) "
                                     "and Muon + AdamW (v3); at every step measure how far the rows of wte moved for "
                                     "tokens present in the batch and absent from it, and the share of lm_head rows "
                                     "with a gradient. Writes sparse_updates.md, .json and .png to --out.")
    xs.add_argument("--data", help="a folder made by `andrea prepare` (default: a small corpus of andrea's own "
                                   "docstrings, made on the spot)")
    xs.add_argument("--out", default="runs/sparse-updates", help="where to write the results "
                                                                  "(default runs/sparse-updates)")
    xs.add_argument("--steps", type=flag_number(int, 1, 10_000_000), default=50, help="training steps per optimizer (default 50)")
    xs.add_argument("--seed", type=flag_number(int, 0, MAX_SEED), default=1337, help="one seed for the batches and the initial weights "
                                                           "(default 1337)")
    xs.add_argument("--json", action="store_true", help="machine-readable output (every step's measurements)")
    xs.set_defaults(func=cmd_experiment_sparse_updates)
