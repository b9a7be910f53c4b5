"""The decode plan (andrea.decoding.plan): fixed-shape steps and their graph replay against the
plain paths, and weight layouts against F.linear."""


import pytest
import torch
import torch.nn.functional as F
from helpers import unit_model as generate_model

import andrea.decoding.plan as decode
from andrea.config import ACTIVATIONS, NORMS, POSITION_SCHEMES
from andrea.decoding.generate import BOS, generate_ids
from andrea.decoding.plan import CPULayouts, DecodePlan, StackedQKV, kept_layouts, row_times
from andrea.errors import AndreaError
from andrea.model import KVCache

pytestmark = pytest.mark.usefixtures("one_thread")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def tiny_model(block_size=32, pos="learned", seed=0, **changes):
    """test_generate's 2-layer model with unit-scale weights, at this file's defaults."""
    return generate_model(block_size=block_size, seed=seed, pos=pos, **changes)


def prompt_of(n, seed=1, vocab_size=300):
    return torch.randint(0, vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def greedy(model, prompt, n, **kw):
    return generate_ids(model, prompt, n, greedy=True, stop_at_bos=False, **kw)


# ---------------------------------------------------------------- fixed-shape steps


@pytest.mark.parametrize("pos", POSITION_SCHEMES)
def test_static_steps_give_the_no_cache_tokens_for_every_position_scheme_across_slides(pos):
    # context 32: a 20-token prompt and 60 new tokens slide the window twice
    model = tiny_model(pos=pos)
    prompt = prompt_of(20)
    reference = greedy(model, prompt, 60, use_cache=False)
    assert len(set(reference)) > 10
    assert greedy(model, prompt, 60, decode="static") == reference
    assert greedy(model, prompt, 60, decode="dynamic") == reference
    assert greedy(model, prompt, 60, decode="direct") == reference
    # a prompt longer than the context starts from its last half
    long_prompt = prompt_of(45, seed=2)
    assert greedy(model, long_prompt, 40, decode="static") == greedy(model, long_prompt, 40, use_cache=False)


@pytest.mark.parametrize("pos", POSITION_SCHEMES)
def test_step_matches_the_forward_pass_at_every_position(pos):
    model = tiny_model(block_size=16, pos=pos)
    ids = torch.tensor([prompt_of(16, seed=3)])
    with torch.no_grad():
        full = model(ids)[0]
        cache = KVCache(model.config, 1, max_len=64)
        model(ids[:, :3], cache=cache)
        steps = [model.step(ids[:, t : t + 1], cache, torch.tensor(t))[:, 0] for t in range(3, 16)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 3:], rtol=0, atol=1e-5)


# ---------------------------------------------------------------- the direct step


@pytest.fixture
def set_threads():
    """torch.set_num_threads for one test (this module's one_thread holds for all of them)."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("pos", POSITION_SCHEMES)
def test_the_direct_step_gives_the_forward_pass_logits_for_every_norm_and_activation(pos, threads, set_threads):
    set_threads(threads)  # two threads: the matrices split in blocks, one: whole
    ids = torch.tensor([prompt_of(16, seed=3)])
    for norm in NORMS:
        for act in ACTIVATIONS:
            model = tiny_model(block_size=16, pos=pos, norm=norm, act=act, vocab_size=301)  # odd V: a padded block
            with torch.no_grad():
                full = model(ids)[0][0, 3:]
            plan = DecodePlan(model, mode="direct")
            plan.prefill(ids[0, :3].tolist())
            steps = torch.stack([plan.step(int(ids[0, t])).clone() for t in range(3, 16)])
            assert plan.cache.length == 16
            torch.testing.assert_close(steps, full, rtol=0, atol=1e-5, msg=f"{pos} {norm} {act}")


def test_auto_decodes_directly_on_a_cpu_and_direct_is_refused_elsewhere(monkeypatch):
    model = tiny_model()
    assert DecodePlan(model).mode == "direct"
    monkeypatch.setattr(decode, "is_sharded", lambda m: True)
    assert DecodePlan(model).mode == "dynamic"
    with pytest.raises(AndreaError, match="direct runs on a CPU with the whole model"):
        DecodePlan(model, mode="direct")


def test_a_direct_step_past_the_context_or_the_vocabulary_names_it():
    model = tiny_model(block_size=16)
    plan = DecodePlan(model, mode="direct")
    plan.prefill([1])
    with pytest.raises(AndreaError, match=r"\b299\b"):
        plan.step(300)
    plan.prefill(prompt_of(16))
    with pytest.raises(AndreaError, match=r"\b16\b"):
        plan.step(1)


@pytest.mark.parametrize("threads", [1, 2])
def test_row_times_multiplies_one_row_like_f_linear(threads):
    g = torch.Generator().manual_seed(0)
    layouts = CPULayouts(threads)
    for key, shape in (("narrow", (11, 32)), ("wide", (67, 32)), ("square", (32, 32))):
        w = torch.randn(shape, generator=g)
        x = torch.randn(1, 32, generator=g)
        torch.testing.assert_close(row_times(x, layouts.entry(key, w)), F.linear(x, w), rtol=1e-6, atol=1e-6)


def test_the_layouts_are_kept_between_plans_until_a_weight_or_the_thread_count_changes(set_threads):
    model = tiny_model()
    prompt = prompt_of(6)
    first = DecodePlan(model).linear
    assert DecodePlan(model).linear is first and DecodePlan(tiny_model()).linear is not first
    before = greedy(model, prompt, 20)
    with torch.no_grad():  # an optimizer's step or load_state_dict changes weights in place like this
        model.h[1].mlp.fc1.weight.mul_(-1.0)
    changed = DecodePlan(model).linear
    assert changed is not first
    assert greedy(model, prompt, 20) == greedy(model, prompt, 20, use_cache=False) != before
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # a new tensor
    assert DecodePlan(model).linear is not changed
    kept = kept_layouts(model)
    set_threads(2)
    assert kept_layouts(model) is not kept and kept_layouts(model).parts == 2


def test_the_static_plan_reuses_its_buffers_and_keeps_the_cache_length():
    model = tiny_model()
    plan = DecodePlan(model, max_len=20, mode="static")
    assert plan.cache.max_len == 64  # fixed-shape caches are a multiple of 64 positions
    pointers = (plan.cache.k.data_ptr(), plan.cache.v.data_ptr(), plan.ids.data_ptr(), plan.pos.data_ptr())
    plan.prefill(prompt_of(5))
    for t in range(10):
        plan.step(t)
        assert plan.cache.length == 6 + t and int(plan.pos) == 5 + t
    assert (plan.cache.k.data_ptr(), plan.cache.v.data_ptr(), plan.ids.data_ptr(), plan.pos.data_ptr()) == pointers


def test_a_static_step_past_the_context_names_it():
    model = tiny_model(block_size=16)
    plan = DecodePlan(model, mode="static")
    plan.prefill(prompt_of(16))
    with pytest.raises(AndreaError, match=r"\b16\b"):
        plan.step(1)
    plan.prefill(prompt_of(3))
    with pytest.raises(AndreaError, match=r"\b300\b"):
        plan.step(300)


def test_the_step_is_one_graph_with_no_host_reads_at_any_position():
    # what a CUDA graph needs, checked on the CPU: dynamo traces the plan's step as one graph
    # (fullgraph), with no value read back to the host in it, and runs that graph at every
    # position without tracing again (a Python value the step depended on would force a retrace)
    import torch._dynamo

    host_reads = {"item", "tolist", "__int__", "__float__", "__bool__"}
    graphs = []

    def inspect(gm, example_inputs):
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_method" and n.target in host_reads
                       or n.op == "call_function" and "local_scalar_dense" in str(n.target)])
        return gm.forward

    model = tiny_model(pos="rope")
    reference = greedy(model, prompt_of(6), 12, decode="dynamic")
    plan = DecodePlan(model, max_len=24, mode="static")
    torch._dynamo.reset()
    model.step = torch.compile(model.step, fullgraph=True, backend=inspect, dynamic=False)
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            logits = plan.prefill(prompt_of(6))
            out = []
            for _ in range(12):
                out.append(int(logits.argmax()))
                logits = plan.step(out[-1])
    finally:
        del model.step
        torch._dynamo.reset()
    assert graphs == [[]]
    assert out == reference


def test_graph_mode_without_cuda_runs_the_same_step_eagerly_and_says_why():
    model = tiny_model()
    prompt = prompt_of(20)
    plan = DecodePlan(model, max_len=30, mode="graph")
    plan.prefill(prompt)
    plan.step(5)
    assert plan.graph is None and "CUDA" in plan.fallback
    assert greedy(model, prompt, 50, decode="graph") == greedy(model, prompt, 50, use_cache=False)


def test_a_failed_capture_falls_back_to_eager_steps(monkeypatch):
    calls = []

    def refuse(run, device, warmup=2):
        calls.append(device)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(decode, "capture_graph", refuse)
    model = tiny_model()
    plan = DecodePlan(model, mode="graph")
    logits = plan.prefill(prompt_of(4))
    for _ in range(5):
        logits = plan.step(int(logits.argmax()))
    assert len(calls) == 1 and plan.fallback == "RuntimeError: operation not permitted when stream is capturing"


def test_a_replayed_output_buffer_is_what_each_step_returns(monkeypatch):
    # a stand-in for a graph: replay reruns the captured function and writes the captured output,
    # as a CUDA graph writes its output buffer; the plan must fill its buffers before each replay
    class Replay:
        def __init__(self, run):
            self.run = run

        def replay(self):
            self.output.copy_(self.run())

    def capture(run, device, warmup=2):
        graph = Replay(run)
        graph.output = run().clone()
        return graph, graph.output

    monkeypatch.setattr(decode, "capture_graph", capture)
    model = tiny_model(pos="sinusoidal")
    prompt = prompt_of(10)
    tokens = greedy(model, prompt, 40, decode="graph")
    assert tokens == greedy(model, prompt, 40, use_cache=False)


def test_sampling_and_bos_behave_the_same_with_fixed_shapes():
    model = tiny_model()
    prompt = prompt_of(12)
    for kw in ({"seed": 3}, {"seed": 4, "top_k": 5}, {"seed": 5, "top_p": 0.8, "temperature": 0.7}):
        assert (generate_ids(model, prompt, 30, stop_at_bos=False, decode="static", **kw)
                == generate_ids(model, prompt, 30, stop_at_bos=False, use_cache=False, **kw))
    with torch.no_grad():  # a model that always says BOS: nothing comes out
        model.lm_head.weight.zero_()
        model.lm_head.weight[BOS] = 1.0
        model.ln_f.weight.zero_()
        model.ln_f.bias.fill_(1.0)
    assert generate_ids(model, prompt, 10, decode="static") == []


def test_an_unknown_decode_mode_is_refused():
    with pytest.raises(AndreaError, match="decode mode"):
        generate_ids(tiny_model(), [1, 2], 3, decode="fast")
    with pytest.raises(AndreaError, match="decode mode"):
        DecodePlan(tiny_model(), mode="fast")


# ---------------------------------------------------------------- weight layouts


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_cpu_layouts_multiply_like_f_linear(threads):
    g = torch.Generator().manual_seed(0)
    linear = CPULayouts(threads)
    for key, shape in (("narrow", (10, 32)), ("wide", (67, 32)), ("square", (32, 32))):
        w = torch.randn(shape, generator=g)
        x = torch.randn(3, 1, 32, generator=g)
        torch.testing.assert_close(linear(x, key, w), F.linear(x, w), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(linear(x, key, w), F.linear(x, w), rtol=1e-6, atol=1e-6)  # the kept copy
    assert linear.weights["wide"][0] == ("split" if threads > 1 else "in-out")


def test_the_stacked_qkv_matrix_is_made_once():
    made = []
    w = torch.randn(12, 4)

    def make():
        made.append(1)
        return w

    linear = StackedQKV()
    x = torch.randn(1, 1, 4)
    for _ in range(3):
        torch.testing.assert_close(linear(x, ("qkv", 0), make), F.linear(x, w))
    assert len(made) == 1


# ---------------------------------------------------------------- on a CUDA device


@cuda
def test_cuda_graph_replay_gives_the_eager_tokens():
    model = tiny_model(block_size=64).cuda()
    prompt = prompt_of(30)
    plan = DecodePlan(model, mode="graph")
    plan.prefill(prompt)
    plan.step(1)
    assert plan.graph is not None, plan.fallback
    graphed = greedy(model, prompt, 80, decode="graph")
    assert graphed == greedy(model, prompt, 80, decode="static")
    assert graphed == greedy(model, prompt, 80, use_cache=False)


@cuda
def test_no_host_sync_in_a_training_step_or_a_decode_step():
    model = tiny_model(block_size=64).cuda().train()
    ids = torch.randint(0, 300, (2, 33), device="cuda")
    plan = DecodePlan(model.eval(), mode="static")
    plan.prefill(prompt_of(5))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model.train()(ids[:, :-1], ids[:, 1:])
        loss.backward()
        model.eval()
        with torch.inference_mode():
            plan.ids.fill_(3)
            plan.pos.fill_(5)
            plan._run_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
