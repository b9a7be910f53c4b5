"""`andrea doctor`: what this machine computes natively, what andrea chose for it, and how far the
main job gets here (`andrea.processor`, `andrea.mainjob.time_cpu_step`)."""

from __future__ import annotations

from andrea.cli.common import print_json
from andrea.validate import flag_number


def cmd_doctor(args) -> int:
    import os
    import sys

    import torch

    from andrea.mainjob import MainJob, time_cpu_step
    from andrea.processor import ENV, SHAPE, bf16_verdict, cache_file, cached_verdict, measure

    print(f"measuring this processor's products and timing {args.steps + 1} of the main job's training steps ...",
          file=sys.stderr, flush=True)
    verdict = bf16_verdict(refresh=True)  # measured now (and cached), unless ANDREA_BF16 sets it
    rates = verdict if verdict.f32_gflops is not None else measure()  # rates to show when the verdict is forced
    job = MainJob.on("cpu")
    shape = job.shape("cpu")
    step = time_cpu_step(job, steps=args.steps)
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    native = verdict.native
    peak = rates.rate(native)  # what a CPU run's MFU is taken against
    report = {
        "processor": verdict.processor, "cores": os.cpu_count(), "torch": torch.__version__,
        "threads": verdict.threads, "capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_flags": verdict.flags, "flags_known": verdict.flags_known,
        "product": "x".join(map(str, SHAPE)), "f32_gflops": rates.f32_gflops, "bf16_gflops": rates.bf16_gflops,
        "bf16_native": verdict.native, "verdict_source": verdict.source, "choice": verdict.choice(),
        "training_format": "bfloat16 autocast" if native else "float32", "mfu_peak_gflops": peak,
        "main_job": {"preset": shape["preset"], "batch_size": shape["batch_size"], "seq_len": shape["seq_len"],
                     "recipe": job.recipe, "step_seconds": step, "minutes": args.minutes,
                     "steps": int(args.minutes * 60 / step)},
        "cuda": cuda,
    }
    if args.json:
        print_json(report)
        return 0
    m, k, n = SHAPE
    flags = ", ".join(verdict.flags) if verdict.flags else ("none" if verdict.flags_known else "unknown (not readable here)")
    print(f"processor: {verdict.processor}; {os.cpu_count()} cores; torch {torch.__version__} on {verdict.threads} "
          f"threads, CPU capability {report['capability']}")
    print(f"bfloat16 flags: {flags}")
    print(f"a {m}×{k} @ {k}×{n} product: float32 {rates.f32_gflops:,.1f} GFLOP/s, bfloat16 {rates.bf16_gflops:,.1f} "
          f"GFLOP/s ({rates.bf16_gflops / rates.f32_gflops:.2f}× float32)")
    if verdict.f32_gflops is None:
        where = f"set by {ENV}"
    elif cached_verdict() is not None:  # read back: "kept" only where it was
        where = f"measured now, kept in {cache_file()}"
    else:
        where = f"measured now; {cache_file()} could not be written, so it is measured again next time"
    print(f"bfloat16: {'native' if verdict.native else 'emulated'} ({where})")
    print(verdict.choice())
    print(f"a CPU run's MFU is taken against {'bfloat16' if native else 'float32'}'s {peak:,.1f} GFLOP/s above, the "
          f"format its step runs in")
    print(f"the main job's training step ({shape['preset']}, {shape['batch_size']} × {shape['seq_len']}, recipe "
          f"{job.recipe}): {step:.2f} s, the fastest of {args.steps}; about {report['main_job']['steps']:,} steps in "
          f"{args.minutes:g} minutes (the step alone: evaluations and checkpoints take some of the time)")
    if cuda:
        print(f"CUDA: {cuda}; andrea main trains there instead, in bfloat16 autocast")
    return 0


def register(sub) -> None:
    p = sub.add_parser("doctor", help="what this machine computes natively, andrea's choice, and the main job's speed here",
                       description="Measure this processor: its bfloat16 flags, a float32 and a bfloat16 matrix product "
                                   "of the main job's shape, and whether bfloat16 is native here (the verdict is cached "
                                   "and this measures it again); say what andrea chose (training's products, Muon's "
                                   "orthogonalization included, in bfloat16 autocast or in float32, and the rate MFU "
                                   "is taken against) and time a few of the main job's training steps to say how "
                                   "many fit in its minutes. ANDREA_BF16=native or emulated sets the verdict instead.")
    p.add_argument("--steps", type=flag_number(int, 1, 1_000), default=3, help="training steps to time, after one warm-up (default 3)")
    p.add_argument("--minutes", type=flag_number(float, 0, 10_000, lo_open=True), default=15.0, help="the training time the step count is for (default 15)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)
