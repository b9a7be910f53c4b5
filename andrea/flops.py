"""FLOPs per token and the peak throughput of the device, for MFU.

FLOPs per trained token follow the usual rule: 6·N for the matmuls of forward and backward, N the
parameters that multiply (everything but the two lookup tables), plus 12·L·T·d for attention's
QKᵀ and AV products over a context of T. MFU = achieved FLOP/s ÷ peak.

On a GPU the peak is the bf16 dense tensor-core figure from the vendor's data sheet. On a CPU there
is no data sheet figure we can trust, so the peak is measured: the rate of the product
`andrea doctor` times, in the number format the training step runs in (bfloat16 where the CPU
computes it natively, else float32; `andrea.processor.cpu_peak_flops`), so MFU compares the step
with what the processor does in that same format.
"""

from __future__ import annotations

import torch

from andrea.config import ModelConfig, count_params
from andrea.processor import cpu_peak_flops

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


def peak_flops(device: torch.device | str) -> float | None:
    device = torch.device(device)
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device))
    if device.type == "cpu":
        return cpu_peak_flops()
    return None
