"""FLOPs per token and the peak throughput of the device, for MFU.

FLOPs per trained token follow the usual rule: 6·N for the matmuls of forward and backward, N the
parameters that multiply (everything but the two lookup tables), plus 12·L·T·d for attention's
QKᵀ and AV products over a context of T. MFU = achieved FLOP/s ÷ peak.

Peaks are bf16 dense tensor-core figures from the vendors' data sheets. On a CPU there is no data
sheet figure we can trust, so the peak is measured: the fastest of a few large fp32 matmuls with
all threads.
"""

from __future__ import annotations

import time

import torch

from andrea.config import ModelConfig, count_params

# bf16 dense TFLOP/s by device name fragment (first match wins)
PEAK_TFLOPS = [
    ("H200", 989.0),
    ("H100", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
    ("A10G", 125.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
    ("V100", 125.0),
    ("T4", 65.0),
]


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters that take part in matmuls: all but the token and position lookup tables."""
    lookups = cfg.vocab_size * cfg.n_embd + (cfg.block_size * cfg.n_embd if cfg.pos == "learned" else 0)
    return count_params(cfg) - lookups


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> float:
    T = seq_len or cfg.block_size
    return 6 * matmul_params(cfg) + 12 * cfg.n_layer * T * cfg.n_embd


def gpu_peak_flops(name: str) -> float | None:
    for fragment, tflops in PEAK_TFLOPS:
        if fragment.lower() in name.lower():
            return tflops * 1e12
    return None


_cpu_peak: float | None = None


def measure_cpu_peak(sizes=(512, 1024, 2048), seconds: float = 1.2, rounds: int = 3) -> float:
    """fp32 matmul FLOP/s with the current torch thread count: the best over square products of a
    few sizes, each timed in a few short rounds (a busy machine only ever makes a round slower,
    and which size BLAS runs fastest differs between machines and instruction sets), measured
    once per process, then cached."""
    global _cpu_peak
    if _cpu_peak is None:
        best = 0.0
        for n in sizes:
            a, b = torch.randn(n, n), torch.randn(n, n)
            torch.mm(a, b)
            for _ in range(rounds):
                reps, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds / rounds / len(sizes):
                    torch.mm(a, b)
                    reps += 1
                best = max(best, 2 * n**3 * reps / (time.perf_counter() - start))
        _cpu_peak = best
    return _cpu_peak


def peak_flops(device: torch.device | str) -> float | None:
    device = torch.device(device)
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device))
    if device.type == "cpu":
        return measure_cpu_peak()
    return None
