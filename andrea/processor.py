"""What this machine's processor does natively: whether a bfloat16 matrix product is faster than
a float32 one here, measured once per processor and cached; and its mode for subnormal floats.

Many CPUs have no bfloat16 arithmetic (most laptops; AMD before Zen 4; Intel without AVX512_BF16
or AMX): there oneDNN emulates a bf16 product, about a hundred times slower than the same product
in float32. A hot path that casts to bf16 on such a CPU loses far more than it saves, so andrea
never chooses a CPU number format by assumption. `bf16_verdict()` reads the processor's flags
(AVX512_BF16 or AMX on x86, BF16 on Arm), then times a 256×1024 @ 1024×256 product (the main
job's MLP shape) in both formats on torch's threads, and calls bf16 *native* when the flags allow
it and the bf16 product is the faster one. The verdict is kept in `processor.json` under the
cache folder, keyed by what decides it (the processor's name and flags, the machine, torch's
version, threads and CPU capability, and the ISA limits oneDNN and ATen read from the
environment), so it is measured again when any of them changes.

`ANDREA_BF16=native` or `ANDREA_BF16=emulated` sets the verdict without measuring (a machine
whose measurement is disturbed; tests).

Where the verdict is used, `compute_dtype(device)` names the format training's products run in:
bfloat16 on CUDA and on a CPU with native bf16, float32 on every other CPU. Two things follow it:
- the training step's forward and backward run under `training_autocast(device)`: bf16 autocast
  where compute_dtype is bf16, none where it is float32. Weights, optimizer state, gradients and
  the loss stay float32 either way (the loss's log-sum-exp is taken in float32,
  `andrea.loss.ChunkedCrossEntropy`), so a checkpoint does not record the format and a run
  resumes across the two;
- recipe v3's Muon orthogonalizes each momentum matrix in it (`andrea.optim.Muon`).
MFU is taken against `cpu_peak_flops()` on a CPU (`andrea.flops.peak_flops`): the measured rate of the timed product
in the format the step runs in (the rate `andrea doctor` prints), so it compares like with like.
Decoding, serving, the lab and the main job's final evaluation run in the weights' float32, and
embedding snapshots store float16 rows but convert them to float64 before any arithmetic
(`andrea.snapshots.timeline`).

Subnormal floats (float32 below 1.2e-38) cost x86 many times the work of the rest. A fresh model
makes few; a trained one can make many (tiny probabilities, gradients and moments), and then its
step is slower than it was at the start (`benchmarks/bench_denormal.py` measures by how much).
`flush_subnormals()` turns on the processor's flush-to-zero (`torch.set_flush_denormal`): such
numbers become 0, which a step's sums cannot tell apart. The mode belongs to each thread, and
torch's worker threads, started at its first parallel operation, keep the mode they started with;
so the main job (`andrea.mainjob.run_main_job`) and `andrea train` call it before any torch work.
The mode then stays for the rest of the process, and covers Python's own float arithmetic too.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from andrea.cache import cache_root
from andrea.errors import AndreaError
from andrea.validate import same_json

ENV = "ANDREA_BF16"  # "native" or "emulated": the verdict without a measurement
FORCED = ("native", "emulated")
VERSION = 1  # of the cached verdict's layout and rule
MAX_ENTRIES = 16  # identities kept in the cache file
SHAPE = (256, 1024, 256)  # the timed product: (m, k, n), 256 x 1024 @ 1024 x 256
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86's two, and Arm's FEAT_BF16 as Linux names it
# the settings that change which kernels torch and oneDNN pick, read from the environment
ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "ONEDNN_DEFAULT_FPMATH_MODE")


@dataclass
class Verdict:
    """What andrea concluded about bfloat16 on this processor, and the figures it rests on."""

    native: bool  # bf16 matrix products are native here and faster than float32
    processor: str
    threads: int
    flags: list[str]  # the processor's bf16 flags found (empty: none, or flags unreadable)
    flags_known: bool  # whether the processor's flags could be read at all
    f32_gflops: float | None  # measured rates of the timed product (None when the verdict was forced)
    bf16_gflops: float | None
    source: str  # "measured", "cached" or "forced by ANDREA_BF16"

    def reason(self) -> str:
        """Why, in a few words: the flags and the measured rates."""
        if self.f32_gflops is None:
            return f"{self.source}"
        flags = ", ".join(self.flags) if self.flags else ("no bf16 flag" if self.flags_known else "flags unknown")
        return f"{flags}; bf16 {self.bf16_gflops:,.1f} vs float32 {self.f32_gflops:,.1f} GFLOP/s, {self.source}"

    def choice(self, recipe: str | None = "v3") -> str:
        """The sentence the main job's header and `andrea doctor` print about training's format
        (and, for recipe v3, Muon's orthogonalization, which follows it)."""
        muon = " and Muon's orthogonalization" if recipe == "v3" else ""
        if self.native:
            return f"training's products{muon} in bfloat16 (autocast): this CPU computes bfloat16 natively"
        return f"training's products{muon} in float32: this CPU emulates bfloat16"

    def rate(self, native: bool) -> float | None:
        """The measured GFLOP/s of the timed product in bfloat16 (`native`) or float32; None when forced."""
        return self.bf16_gflops if native else self.f32_gflops


def processor_line(verdict: Verdict, recipe: str | None = None) -> str:
    """One line for a run's header: the processor, its threads, whether bf16 is native, and the
    number format training runs in because of it."""
    kind = "native" if verdict.native else "emulated"
    return f"processor: {verdict.processor}, {verdict.threads} threads; bfloat16 {kind} ({verdict.reason()}); " \
           f"{verdict.choice(recipe)}"


def processor_name() -> str:
    """The processor's model name as the system reports it."""
    for line in _cpuinfo().splitlines():
        if line.split(":", 1)[0].strip() in ("model name", "Model", "Hardware"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown processor"


def processor_flags() -> set[str] | None:
    """The processor's feature flags (x86 `flags`, Arm `Features`), or None where they cannot be read."""
    text = _cpuinfo()
    for line in text.splitlines():
        if line.split(":", 1)[0].strip() in ("flags", "Features"):
            return set(line.split(":", 1)[1].split())
    return None


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def identity() -> dict:
    """What decides the verdict: a change in any of these measures it again."""
    import torch

    flags = processor_flags()
    return {"version": VERSION, "processor": processor_name(), "machine": platform.machine(),
            "flags": hashlib.sha256(" ".join(sorted(flags or ())).encode()).hexdigest()[:16],
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "environment": {k: os.environ[k] for k in ISA_VARIABLES if k in os.environ}}


def product_rates(repeats: int = 3) -> tuple[float, float]:
    """GFLOP/s of the SHAPE product in float32 and in bfloat16 on torch's threads: the best of
    `repeats` timings after one warm-up (an emulated bf16 product takes ~0.1 s, so this stays short)."""
    import torch

    m, k, n = SHAPE
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    rates = []
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        torch.mm(x, y)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(x, y)
            best = min(best, time.perf_counter() - start)
        rates.append(2 * m * k * n / max(best, 1e-9) / 1e9)
    return rates[0], rates[1]


def measure() -> Verdict:
    """The verdict from this processor's flags and a timed product, not cached."""
    import torch

    flags = processor_flags()
    found = sorted(f for f in (flags or ()) if f in BF16_FLAGS)
    f32, bf16 = product_rates()
    allowed = bool(found) or flags is None  # flags unread (another system): the timing alone decides
    return Verdict(native=allowed and bf16 > f32, processor=processor_name(), threads=torch.get_num_threads(),
                   flags=found, flags_known=flags is not None, f32_gflops=f32, bf16_gflops=bf16, source="measured")


def cache_file() -> Path:
    return cache_root() / "processor.json"


_memo: dict = {}  # identity (as a string) -> Verdict, for this process


def bf16_verdict(refresh: bool = False) -> Verdict:
    """This processor's verdict: ANDREA_BF16 when set, else the cached one when it was measured on
    what is here now, else measured now and cached. `refresh` measures again in any case."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced:
        if forced not in FORCED:
            raise AndreaError(f"{ENV} must be one of {', '.join(FORCED)} (or unset to measure), got {forced!r}.")
        import torch

        flags = processor_flags()
        return Verdict(native=forced == "native", processor=processor_name(), threads=torch.get_num_threads(),
                       flags=sorted(f for f in (flags or ()) if f in BF16_FLAGS), flags_known=flags is not None,
                       f32_gflops=None, bf16_gflops=None, source=f"forced by {ENV}={forced}")
    ident = identity()
    key = _key(ident)
    if not refresh and key in _memo:
        return _memo[key]
    verdict = None if refresh else _read_cached(ident)
    if verdict is None:
        verdict = measure()
        _write_cached(ident, verdict)
    _memo[key] = verdict
    return verdict


def _key(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _cache_shape():
    """processor.json's declared shape: every field of every verdict of its type and range, rates
    finite and below 10^9 GFLOP/s (a 400-digit rate would overflow later), threads an integer."""
    from andrea.validate import Shape

    rate = Shape.real(1e-9, 1e9)
    verdict = Shape.record(native=Shape.flag(), processor=Shape.text(), threads=Shape.integer(1, 1 << 16),
                           flags=Shape.items(Shape.text(64), 64), flags_known=Shape.flag(), f32_gflops=rate,
                           bf16_gflops=rate, source=Shape.text(64))
    return Shape.record(verdicts=Shape.mapping(Shape.record(identity=Shape.anything(), verdict=verdict), 4 * MAX_ENTRIES))


def _read_entries() -> dict:
    """The cached verdicts by identity key; {} when there is no cache, or one that does not read
    back whole in its declared shape (it is measured again, never believed)."""
    from andrea.files import read_json

    try:
        return read_json(cache_file(), "the processor's cached verdicts", shape=_cache_shape())["verdicts"]
    except (AndreaError, OSError):
        return {}


def _read_cached(ident: dict) -> Verdict | None:
    """The cached verdict measured on this identity, when it reads back whole; else None."""
    entry = _read_entries().get(_key(ident))
    if entry is None or not same_json(entry["identity"], ident):  # true == 1 must not pass for this identity
        return None
    try:
        verdict = Verdict(**entry["verdict"])  # its fields' types and ranges are the file's declared shape
    except TypeError:
        return None
    verdict.source = "cached"
    return verdict


def cached_verdict() -> Verdict | None:
    """The verdict the cache holds for this processor as it is now, read back and checked (None
    where there is none, or it does not read)."""
    return _read_cached(identity())


def _write_cached(ident: dict, verdict: Verdict) -> None:
    """Keep the verdict for the next process, beside those of other identities (the same machine
    with other threads or ISA limits), the newest MAX_ENTRIES. A cache folder that cannot be
    written only costs a measurement next time."""
    from andrea.files import atomic_write_bytes

    entries = {k: v for k, v in _read_entries().items() if k != _key(ident)}
    entries[_key(ident)] = {"identity": ident, "verdict": asdict(verdict)}
    entries = dict(list(entries.items())[-MAX_ENTRIES:])
    try:
        cache_file().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(cache_file(), (json.dumps({"verdicts": entries}, indent=1) + "\n").encode())
    except (AndreaError, OSError):
        pass


def flush_subnormals() -> bool:
    """Flush subnormal floats to zero in this thread and in the threads torch starts after it;
    False where the processor has no such mode. Call it before torch's first parallel operation:
    worker threads already running keep their own mode."""
    import torch

    return torch.set_flush_denormal(True)


def compute_dtype(device) -> "torch.dtype":  # noqa: F821 (torch is imported when asked)
    """The number format training's products run in on `device`: bfloat16 on CUDA and on a CPU
    that computes it natively and faster, float32 on every other CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu":
        return torch.bfloat16 if bf16_verdict().native else torch.float32
    return torch.float32  # meta (the formats' bookkeeping) and others: no products run


def training_autocast(device):
    """The context a training step's forward (and so its backward) runs in on `device`: bfloat16
    autocast where compute_dtype is bfloat16, nothing where it is float32."""
    from contextlib import nullcontext

    import torch

    device = torch.device(device)
    if compute_dtype(device) == torch.bfloat16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


_forced_rates: dict = {}  # identity (as a string) -> (float32, bfloat16) GFLOP/s, measured where the verdict was forced


def cpu_peak_flops() -> float:
    """The peak FLOP/s a CPU training step's MFU is taken against: the measured rate of the timed
    product (SHAPE) in the format the step runs in (compute_dtype), the figure `andrea doctor`
    prints. Where ANDREA_BF16 forces the verdict, the product is timed once per process for it."""
    import torch

    verdict = bf16_verdict()
    native = compute_dtype("cpu") == torch.bfloat16
    rate = verdict.rate(native)
    if rate is None:
        key = _key(identity())
        if key not in _forced_rates:
            _forced_rates[key] = product_rates()
        rate = _forced_rates[key][1 if native else 0]
    return rate * 1e9
