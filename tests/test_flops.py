"""FLOPs per token and device peaks, the two halves of MFU."""

import pytest

from andrea.config import get_preset
from andrea.flops import flops_per_token, gpu_peak_flops, matmul_params, peak_flops


def test_matmul_parameters_leave_out_the_two_lookup_tables():
    cfg = get_preset("andrea-12m")
    assert matmul_params(cfg) == 12_790_272 - 2_305 * 384 - 1_024 * 384 == 11_511_936
    assert matmul_params(cfg.replace(pos="rope")) == 11_511_936  # no position table to leave out


def test_flops_per_token_is_six_n_plus_attention():
    cfg = get_preset("andrea-120m")
    n = 98_737_152 - 8_449 * 768 - 1_024 * 768
    assert flops_per_token(cfg) == 6 * n + 12 * 12 * 1024 * 768
    assert flops_per_token(cfg, 256) == 6 * n + 12 * 12 * 256 * 768


@pytest.mark.parametrize("name, tflops", [("NVIDIA H200", 989), ("NVIDIA H100 80GB HBM3", 989),
                                          ("NVIDIA A100-SXM4-40GB", 312), ("NVIDIA GeForce RTX 4090", 165)])
def test_gpu_peaks_come_from_the_table(name, tflops):
    assert gpu_peak_flops(name) == tflops * 1e12


def test_an_unknown_gpu_has_no_peak_and_the_cpu_peak_is_measured():
    assert gpu_peak_flops("Some Future Accelerator") is None
    assert peak_flops("cpu") > 1e8  # a real matmul rate, in FLOP/s (which format's: tests/test_processor.py)
