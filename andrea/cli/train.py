"""`andrea prepare` (documents → token shards) and `andrea train`."""

from __future__ import annotations

from andrea.validate import flag_number

SHARD_TOKENS = 100_000_000  # andrea.prepare.SHARD_TOKENS (not imported here: --help stays fast)
MIN_SHARD_TOKENS, MAX_SHARD_TOKENS = 1_000, 2**40  # andrea.prepare's


def cmd_prepare(args) -> int:
    from andrea.prepare import prepare
    from andrea.tokenizer.harris import HarrisTokenizer

    tokenizer = HarrisTokenizer.load(args.tokenizer)
    manifest = prepare(tokenizer, args.sources, args.out, text_field=args.text_field, val_share=args.val_share,
                       shard_tokens=args.shard_tokens, workers=args.workers, progress=not args.no_progress)
    total = sum(e["train"]["tokens"] + e["val"]["tokens"] for e in manifest["sources"].values())
    shards = sum(len(e[s]["shards"]) for e in manifest["sources"].values() for s in ("train", "val"))
    print(f"wrote {len(manifest['sources'])} source(s), {total:,} tokens in {shards} shards, to {args.out}")
    return 0


def add_train_arguments(p) -> None:
    """The flags of `andrea train`: --config, --resume, --no-progress, and one flag per training
    setting (andrea.trainconfig), each overriding the same field of --config when given."""
    from andrea.trainconfig import add_arguments

    p.add_argument("--config", help="a training config JSON (sources with floors and caps, curriculum, audit, "
                   "recipe, sizes); the flags below override its fields")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    add_arguments(p.add_argument_group("training settings (the same names, with _ for -, in the JSON config)"))


def cmd_train(args) -> int:
    from andrea.signals import Signals, is_main_process

    # the run's signal handlers come first, before torch is imported: a SIGUSR1 or SIGTERM during
    # the start-up is then the run's to answer (andrea.signals), not the end of the process
    with Signals(install=is_main_process()) as signals:
        return _train_command(args, signals)


def _train_command(args, signals) -> int:
    from andrea.processor import flush_subnormals

    flush_subnormals()  # before torch starts its worker threads (andrea.processor)
    from andrea.config import resolve_config
    from andrea.errors import AndreaError
    from andrea.train import train
    from andrea.trainconfig import TrainConfig, apply_overrides, setting_flags

    cfg = TrainConfig.load(args.config) if args.config else TrainConfig()
    flags = setting_flags(args)
    if flags.get("preset") or flags.get("model_config"):  # a model chosen on the command line replaces the file's
        cfg.preset = cfg.model_config = None
    cfg = apply_overrides(cfg, **flags)
    if not cfg.data or not cfg.out:
        raise AndreaError("andrea train needs --data (a prepared folder) and --out (a run folder), on the command line or in --config.")
    model_cfg = resolve_config(cfg.preset or ("andrea-cpu" if not cfg.model_config else None), cfg.model_config)
    if cfg.max_steps is None and cfg.time_limit is None:
        raise AndreaError("give --max-steps or --time-limit (or both) so the run knows when to stop.")
    result = train(model_cfg, cfg, resume=args.resume, progress=not args.no_progress, signals=signals)
    if result.eval and result.checkpoint:
        print(f"validation: {result.eval['all']['bpb']:.4f} bits per byte (loss {result.eval['all']['loss']:.4f}) "
              f"at step {result.step:,}; checkpoint {result.checkpoint}")
    return 0 if result.stopped != "audit" else 3


def register(sub) -> None:
    p = sub.add_parser("prepare", help="tokenize sources into token shards for training",
                       description="Stream each source's documents, encode them with a tokenizer on every core and "
                                   "write uint16 token shards (every document starts with BOS): train and val "
                                   "shards of about --shard-tokens tokens each, then manifest.json with every "
                                   "shard's token count and SHA-256. A validation document is chosen by a stable "
                                   "hash of its text, so adding files never reshuffles the split. A stopped "
                                   "preparation resumes after its last whole shard when run again with the same "
                                   "arguments.")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder (from `andrea tokenizer train`)")
    p.add_argument("--out", required=True, help="the data folder to write")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="a fetched source name (chitchat, brown, big-txt, austen, sotu, ...), a .txt, .jsonl or .parquet file "
                        "(.txt and .jsonl also .gz or .zst compressed), or a folder of them (read recursively, in "
                        "sorted order); NAME=PATH names the source (default: the file or folder name)")
    p.add_argument("--text-field", default="text", metavar="NAME",
                   help="the JSONL field or parquet column that holds the text (default text)")
    p.add_argument("--val-share", type=flag_number(float, 0, 1), default=None, metavar="P",
                   help="the share of documents held out for validation (default 0.05; a fetched source keeps "
                        "its own split)")
    p.add_argument("--shard-tokens", type=flag_number(int, MIN_SHARD_TOKENS, MAX_SHARD_TOKENS), default=SHARD_TOKENS, metavar="N",
                   help=f"training tokens per shard, {MIN_SHARD_TOKENS:,} to 2^40 (default {SHARD_TOKENS:,}, files of 200 MB)")
    p.add_argument("--workers", type=flag_number(int, 1, 1_024), default=None, metavar="K", help="encoding processes (default: every core)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_prepare)

    t = sub.add_parser("train", help="train a model on prepared data (one process, or torchrun for several)",
                       description="Train an ANDREA model. Checkpoints are written atomically every "
                                   "--checkpoint-every steps, on SIGTERM and Ctrl-C, and at once on SIGUSR1; "
                                   "--resume continues exactly where the last one left off. Run several processes "
                                   "with `torchrun --nproc_per_node=K -m andrea train ...`.")
    add_train_arguments(t)
    t.set_defaults(func=cmd_train)
