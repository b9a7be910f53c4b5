"""andrea.processor and andrea.optim.Muon: bfloat16 runs on the hot path only where the processor
computes it natively, and there every product of a training step runs in it. Pinned by the dtypes
of the matrix products one optimizer step and one whole training step dispatch (forced either way),
the peak MFU is taken against, a run resumed across the two formats, torch's own Muon as the peer for the bfloat16 step, and the verdict's cache
read back, kept apart per processor and refreshed when the processor changes."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from andrea import processor
from andrea.cli import main
from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.model import ANDREA
from andrea.optim import Muon, make_optimizer, orthogonalize

pytestmark = pytest.mark.usefixtures("one_thread")

PRODUCTS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_addmm_activation", "dot", "mv"}


class ProductDtypes(TorchDispatchMode):
    """Records the dtype of every matrix product dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in PRODUCTS:
            self.seen.append(next(a.dtype for a in args if isinstance(a, torch.Tensor)))
        return func(*args, **(kwargs or {}))


def tiny() -> ANDREA:
    torch.manual_seed(0)
    return ANDREA(ModelConfig(vocab_size=300, n_embd=32, n_head=2, n_layer=2, block_size=16))


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache folder, no verdict remembered by this process and none forced."""
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(processor.ENV, raising=False)
    monkeypatch.setattr(processor, "_memo", {})
    return tmp_path / "cache"


def one_v3_step_products(monkeypatch, verdict: str) -> list[torch.dtype]:
    monkeypatch.setenv(processor.ENV, verdict)
    model = tiny()
    opt = make_optimizer(model, "v3", lr=1e-2, device="cpu")
    x = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    model(x, targets=x)[1].backward()
    with ProductDtypes() as mode:
        opt.step()
    return mode.seen


def test_v3_step_runs_no_bfloat16_product_where_bfloat16_is_emulated(monkeypatch):
    seen = one_v3_step_products(monkeypatch, "emulated")
    assert seen and torch.bfloat16 not in seen  # 12 matrices x 5 Newton-Schulz rounds, all float32
    assert set(seen) == {torch.float32}


def test_v3_step_orthogonalizes_in_bfloat16_where_it_is_native(monkeypatch):
    seen = one_v3_step_products(monkeypatch, "native")
    assert seen.count(torch.bfloat16) == 12 * 5 * 3  # 12 block matrices, 5 rounds, 3 products a round


def test_muon_in_bfloat16_equals_torchs_muon():
    """The peer: torch.optim.Muon, which always orthogonalizes in bfloat16. Three steps on the same
    gradients leave the same weights and the same momentum, bit for bit."""
    a, b = tiny(), tiny()
    ma = [p for n, p in a.named_parameters() if p.dim() == 2 and ".h." in f".{n}"]
    mb = [p for n, p in b.named_parameters() if p.dim() == 2 and ".h." in f".{n}"]
    kw = dict(lr=2e-2, weight_decay=0.1, momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw")
    ours, peer = Muon(ma, ns_dtype=torch.bfloat16, **kw), torch.optim.Muon(mb, **kw)
    x = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(2))
    for _ in range(3):
        for model, opt in ((a, ours), (b, peer)):
            opt.zero_grad()
            model(x, targets=x)[1].backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert all(torch.equal(ours.state[p]["momentum_buffer"], peer.state[q]["momentum_buffer"]) for p, q in zip(ma, mb))
    # the state dicts are the same shape, so a checkpoint written by either loads into the other
    sa, sb = ours.state_dict(), peer.state_dict()
    assert sa["param_groups"] == sb["param_groups"] and sorted(sa["state"]) == sorted(sb["state"])


def test_float32_orthogonalization_is_closer_to_exact_arithmetic_and_leaves_its_input():
    """In float32 the iteration matches float64's to ~1e-6 (bfloat16's differs by ~1e-2), and the
    momentum it is given is not changed in place (the float32 cast is a copy)."""
    g = torch.randn(24, 64, generator=torch.Generator().manual_seed(3))
    before = g.clone()
    coeffs = (3.4445, -4.7750, 2.0315)
    exact = orthogonalize(g.double(), coeffs, 5, 1e-7, torch.float64)
    f32 = orthogonalize(g, coeffs, 5, 1e-7, torch.float32)
    bf16 = orthogonalize(g, coeffs, 5, 1e-7, torch.bfloat16)
    assert torch.equal(g, before) and f32.dtype == torch.float32
    assert (f32.double() - exact).abs().max() < 1e-5 < (bf16.double() - exact).abs().max()
    tall = orthogonalize(g.T.contiguous(), coeffs, 5, 1e-7, torch.float32)  # a tall matrix: worked on its transpose
    assert torch.allclose(tall, f32.T, atol=1e-6)


def test_v3_checkpoint_state_loads_across_the_two_choices(monkeypatch):
    """A state saved by a run that orthogonalized in bfloat16 resumes on a CPU that does it in
    float32, and the other way: the dtype is the optimizer's, not part of its state."""
    monkeypatch.setenv(processor.ENV, "native")
    a = tiny()
    opt_a = make_optimizer(a, "v3", lr=1e-2)
    x = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(4))
    a(x, targets=x)[1].backward()
    opt_a.step()
    monkeypatch.setenv(processor.ENV, "emulated")
    b = copy.deepcopy(a)
    opt_b = make_optimizer(b, "v3", lr=1e-2)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    assert opt_b.optimizers[0].ns_dtype == torch.float32 and opt_a.optimizers[0].ns_dtype == torch.bfloat16
    mom = [opt_b.state[p]["momentum_buffer"] for p in opt_b.param_groups[0]["params"]]
    assert all(torch.equal(m, opt_a.state[p]["momentum_buffer"]) for m, p in zip(mom, opt_a.param_groups[0]["params"]))


def test_verdict_rule_needs_the_flag_and_the_faster_product(fresh, monkeypatch):
    cases = [({"avx512_bf16", "avx2"}, (100.0, 300.0), True),   # native: flag and faster
             ({"avx512_bf16", "avx2"}, (100.0, 2.0), False),    # flag, but oneDNN emulates (ISA limited)
             ({"avx2", "fma"}, (100.0, 300.0), False),          # faster, but no flag: not trusted
             (None, (100.0, 300.0), True),                      # flags unreadable: the timing decides
             (None, (100.0, 1.0), False)]
    for flags, rates, native in cases:
        monkeypatch.setattr(processor, "processor_flags", lambda f=flags: f)
        monkeypatch.setattr(processor, "product_rates", lambda r=rates: r)
        v = processor.measure()
        assert v.native is native, (flags, rates)
        assert v.choice() == ("training's products and Muon's orthogonalization in bfloat16 (autocast): this CPU "
                              "computes bfloat16 natively" if native
                              else "training's products and Muon's orthogonalization in float32: this CPU emulates bfloat16")


def test_verdict_is_measured_once_cached_and_measured_again_when_the_processor_changes(fresh, monkeypatch):
    calls = []
    real = processor.product_rates
    monkeypatch.setattr(processor, "product_rates", lambda: calls.append(1) or real(repeats=1))
    first = processor.bf16_verdict()
    assert first.source == "measured" and len(calls) == 1
    assert processor.bf16_verdict() is first and len(calls) == 1  # this process remembers it
    monkeypatch.setattr(processor, "_memo", {})
    again = processor.bf16_verdict()  # a new process: read back from the cache file, not measured
    assert again.source == "cached" and len(calls) == 1 and again.native == first.native
    # another processor (or the same one with oneDNN limited to AVX2): measured again, both kept
    monkeypatch.setattr(processor, "processor_name", lambda: "Another CPU 9000")
    assert processor.bf16_verdict().source == "measured" and len(calls) == 2
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert processor.bf16_verdict().source == "measured" and len(calls) == 3
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setattr(processor, "_memo", {})
    assert processor.bf16_verdict().source == "cached" and len(calls) == 3
    assert len(json.loads((fresh / "processor.json").read_text())["verdicts"]) == 3
    assert processor.bf16_verdict(refresh=True).source == "measured" and len(calls) == 4


@pytest.mark.hostile
@pytest.mark.parametrize("content", [b"{not json", b"[]", b'{"verdicts": []}', b'{"verdicts": {"x": 1}}',
                                     {"native": "yes", "f32_gflops": float("nan"), "bf16_gflops": -1},
                                     {"f32_gflops": 10**400}, {"bf16_gflops": float("inf")}, {"threads": True},
                                     {"threads": 0}, {"flags_known": "maybe"}, "sparse"])
def test_a_damaged_cache_is_measured_again_not_believed(fresh, monkeypatch, content):
    fresh.mkdir(parents=True)
    if isinstance(content, dict):  # the right identity, a verdict with one field of the wrong kind or range
        ident = processor.identity()
        v = {"native": True, "processor": "x", "threads": 2, "flags": [], "flags_known": True,
             "f32_gflops": 100.0, "bf16_gflops": 300.0, "source": "measured", **content}
        content = json.dumps({"verdicts": {processor._key(ident): {"identity": ident, "verdict": v}}}).encode()
    if content == "sparse":  # 7 GB of nothing: refused by its size before a byte is read
        with open(fresh / "processor.json", "wb") as f:
            f.truncate(7 << 30)
    else:
        (fresh / "processor.json").write_bytes(content)
    monkeypatch.setattr(processor, "product_rates", lambda: (100.0, 1.0))
    v = processor.bf16_verdict()
    assert v.source == "measured" and v.native is False
    assert (fresh / "processor.json").stat().st_size < 10_000  # measured again, and the cache healed


@pytest.mark.hostile
def test_a_wrong_forced_verdict_is_one_sentence(fresh, monkeypatch, capsys):
    monkeypatch.setenv(processor.ENV, "sometimes")
    with pytest.raises(AndreaError, match="ANDREA_BF16 must be one of native, emulated"):
        processor.bf16_verdict()
    assert main(["doctor", "--steps", "1"]) == 2
    assert "ANDREA_BF16 must be one of" in capsys.readouterr().err


def test_train_header_names_the_processor_and_the_choice(fresh, monkeypatch, tmp_path):
    """What the learner reads when a run starts: the processor, its threads and Muon's number format."""
    monkeypatch.setenv(processor.ENV, "emulated")
    v = processor.bf16_verdict()
    line = processor.processor_line(v, "v3")
    assert line.startswith(f"processor: {processor.processor_name()}, {torch.get_num_threads()} threads; bfloat16 emulated")
    assert line.endswith("; training's products and Muon's orthogonalization in float32: this CPU emulates bfloat16")
    assert "Muon" not in processor.processor_line(v, "v2")
    assert processor.processor_line(v, "v2").endswith("; training's products in float32: this CPU emulates bfloat16")
    monkeypatch.setenv(processor.ENV, "native")
    assert processor.processor_line(processor.bf16_verdict(), "v2").endswith(
        "; training's products in bfloat16 (autocast): this CPU computes bfloat16 natively")


def test_doctor_prints_rates_the_choice_and_the_main_jobs_steps(fresh, monkeypatch, capsys):
    """`andrea doctor --json` with the main job's step timed on a tiny preset (the real one takes
    seconds a step): its step count is the minutes over the measured step."""
    from andrea.mainjob_settings import SHAPES

    monkeypatch.setitem(SHAPES["cpu"], "preset", "andrea-tiny")
    monkeypatch.setitem(SHAPES["cpu"], "batch_size", 2)
    monkeypatch.setitem(SHAPES["cpu"], "seq_len", 32)
    assert main(["doctor", "--json", "--steps", "1", "--minutes", "2"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["f32_gflops"] > 0 and r["bf16_gflops"] > 0 and r["verdict_source"] == "measured"
    allowed = bool(r["bf16_flags"]) or not r["flags_known"]
    assert r["bf16_native"] == (allowed and r["bf16_gflops"] > r["f32_gflops"])
    assert r["training_format"] == ("bfloat16 autocast" if r["bf16_native"] else "float32")
    assert r["mfu_peak_gflops"] == (r["bf16_gflops"] if r["bf16_native"] else r["f32_gflops"])
    job = r["main_job"]
    assert job["preset"] == "andrea-tiny" and job["steps"] == int(120 / job["step_seconds"])
    monkeypatch.setenv(processor.ENV, "emulated")
    assert main(["doctor", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16: emulated (set by ANDREA_BF16)" in out and "Muon's orthogonalization in float32" in out
    assert "MFU is taken against float32's" in out
    assert "GFLOP/s" in out  # the rates are measured for the report even when the verdict is forced
    monkeypatch.delenv(processor.ENV)
    assert main(["doctor", "--steps", "1"]) == 0
    assert f"(measured now, kept in {fresh / 'processor.json'})" in capsys.readouterr().out
    # "kept" only where it was: a cache that cannot be written is said to be measured again next time
    blocked = fresh.parent / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("ANDREA_CACHE", str(blocked))
    assert main(["doctor", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "could not be written, so it is measured again next time" in out and "kept in" not in out


SUBNORMAL_PRODUCT = """
import sys, torch
from andrea.processor import flush_subnormals
if sys.argv[1] == "late" and torch.get_num_threads() < 2:
    print("one thread"); raise SystemExit
if sys.argv[1] == "late":
    torch.randn(256, 256) @ torch.randn(256, 256)  # torch starts its worker threads here
if sys.argv[1] != "never" and not flush_subnormals():
    print("unsupported"); raise SystemExit
c = torch.full((1024, 1024), 1e-20) @ torch.full((1024, 1024), 1e-21)  # every entry ~1e-38: subnormal
print(int((c != 0).sum()))
"""


@pytest.mark.parametrize("when, left", [("never", "all"), ("first", "none"), ("late", "some")])
def test_flushing_subnormals_reaches_torchs_threads_only_when_set_before_they_start(when, left):
    """A product whose every entry is subnormal: kept whole without the mode; all 0 when
    flush_subnormals ran first; when torch's worker threads started before it, the entries they
    computed stay subnormal (why the training commands call it before any torch work)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SUBNORMAL_PRODUCT, when], capture_output=True, text=True, check=True)
    if out.stdout.strip() in ("unsupported", "one thread"):
        pytest.skip(f"{out.stdout.strip()}: this processor has no flush-to-zero mode, or torch no worker thread")
    nonzero = int(out.stdout)
    assert {"all": nonzero == 1024 * 1024, "none": nonzero == 0, "some": 0 < nonzero < 1024 * 1024}[left], nonzero


@pytest.mark.parametrize("argv", [["main", "--minutes", "1"], ["train", "--preset", "andrea-tiny"]])
def test_the_training_commands_flush_subnormals_before_anything_else(argv, monkeypatch):
    """`andrea main` (through andrea.mainjob.run_main_job, which benchmarks call too) and `andrea
    train` flush subnormals before doing anything else: nothing is fetched, built or trained first."""
    import andrea.mainjob

    class First(Exception):
        pass

    def first():
        raise First

    monkeypatch.setattr(processor, "flush_subnormals", first)
    monkeypatch.setattr(andrea.mainjob, "flush_subnormals", first)
    with pytest.raises(First):
        main(argv)


from andrea.train import Run  # noqa: E402

REAL_STEP = Run.step  # the step as andrea.train defines it, before any test wraps it


def traced_steps(monkeypatch, verdict: str, data_dir, out, resume: bool = False, max_steps: int = 2):
    """The dtypes of the matrix products of each training step (forward, backward and optimizer)
    of a real `andrea.train.train` run of recipe v3 with the verdict forced, and the run's log."""
    from helpers import opts, tiny_config

    from andrea import train as train_module

    monkeypatch.setenv(processor.ENV, verdict)
    steps = []
    real = REAL_STEP

    def step(self):
        with ProductDtypes() as mode:
            out = real(self)
        steps.append(mode.seen)
        return out

    monkeypatch.setattr(train_module.Run, "step", step)
    lines = []
    train_module.train(tiny_config(data_dir), opts(max_steps=max_steps, recipe="v3", lr=3e-3), data_dir, out,
                       resume=resume, log=lines.append, progress=False)
    return steps, lines


def test_a_training_step_runs_every_product_in_bfloat16_where_it_is_native(monkeypatch, data_dir, tmp_path):
    """Where bf16 is native the step's forward, backward (the loss's head products included) and
    Muon's orthogonalization all run in bf16; the weights, their gradients and Adam's moments stay
    float32. Where it is emulated not one product of the step runs in bf16."""
    native, log = traced_steps(monkeypatch, "native", data_dir, tmp_path / "a")
    assert len(native) == 2 and all(seen and set(seen) == {torch.bfloat16} for seen in native)
    assert any("training's products and Muon's orthogonalization in bfloat16 (autocast)" in line for line in log)
    emulated, log = traced_steps(monkeypatch, "emulated", data_dir, tmp_path / "b")
    assert len(emulated) == 2 and all(seen and set(seen) == {torch.float32} for seen in emulated)
    assert any("training's products and Muon's orthogonalization in float32" in line for line in log)
    from andrea.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tmp_path / "a" / "latest.safetensors")
    assert {t.dtype for t in ckpt.model_state.values()} == {torch.float32}
    assert {t.dtype for per in ckpt.optim_state["state"].values() for t in per.values() if torch.is_tensor(t)
            and t.dim() > 0} == {torch.float32}


def test_a_run_resumes_across_the_two_formats(monkeypatch, data_dir, tmp_path):
    """Begun where bf16 is native, resumed where it is emulated, and the other way: the checkpoint
    holds no format, so each part trains on in its own processor's."""
    first, _ = traced_steps(monkeypatch, "native", data_dir, tmp_path / "a", max_steps=2)
    then, log = traced_steps(monkeypatch, "emulated", data_dir, tmp_path / "a", resume=True, max_steps=4)
    assert any("resuming" in line for line in log)
    assert [set(s) for s in first] == [{torch.bfloat16}] * 2 and [set(s) for s in then] == [{torch.float32}] * 2
    first, _ = traced_steps(monkeypatch, "emulated", data_dir, tmp_path / "b", max_steps=2)
    then, _ = traced_steps(monkeypatch, "native", data_dir, tmp_path / "b", resume=True, max_steps=4)
    assert [set(s) for s in then] == [{torch.bfloat16}] * 2
    from andrea.checkpoint import load_checkpoint

    for run in ("a", "b"):
        ckpt = load_checkpoint(tmp_path / run / "latest.safetensors")
        assert ckpt.step == 4 and all(torch.isfinite(t).all() for t in ckpt.model_state.values())


def test_mfu_is_taken_against_the_measured_rate_of_the_format_the_step_runs_in(fresh, monkeypatch, data_dir, tmp_path):
    """A measured verdict's own rates: bf16's where native, float32's where emulated (what
    `andrea doctor` prints); a forced verdict times the product once for it. The run's meter uses
    that peak."""
    from helpers import opts, tiny_config

    from andrea import train as train_module
    from andrea.flops import peak_flops

    monkeypatch.setattr(processor, "processor_flags", lambda: {"avx512_bf16"})
    monkeypatch.setattr(processor, "product_rates", lambda: (100.0, 300.0))
    assert processor.bf16_verdict().native and peak_flops("cpu") == 300e9
    monkeypatch.setattr(processor, "_memo", {})
    monkeypatch.setattr(processor, "product_rates", lambda: (100.0, 2.0))
    assert not processor.bf16_verdict(refresh=True).native and peak_flops("cpu") == 100e9
    monkeypatch.setattr(processor, "_forced_rates", {})
    monkeypatch.setattr(processor, "product_rates", lambda: (50.0, 700.0))
    monkeypatch.setenv(processor.ENV, "native")
    assert peak_flops("cpu") == 700e9
    monkeypatch.setenv(processor.ENV, "emulated")
    assert peak_flops("cpu") == 50e9
    peaks = []
    real = train_module.Meter.__init__
    monkeypatch.setattr(train_module.Meter, "__init__", lambda self, tps, fpt, peak: peaks.append(peak) or real(self, tps, fpt, peak))
    result = train_module.train(tiny_config(data_dir), opts(max_steps=2), data_dir, tmp_path / "run", log=quiet,
                                progress=False)
    assert peaks == [50e9] and result.mfu is None or result.mfu == result.tokens_per_s * flops(data_dir) / 50e9


def quiet(*_args, **_kwargs):
    pass


def flops(data_dir) -> float:
    from helpers import opts, tiny_config

    from andrea.flops import flops_per_token

    return flops_per_token(tiny_config(data_dir), opts().seq_len)
