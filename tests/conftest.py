import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one torch thread beats two, and by far when other work shares the cores.
    A test module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


LAB_WORDS = ("the cat sat on a mat and the dog ran to its pet owner while kings and queens "
             "talked of unbelievable things rethinking old ideas quickly").split()


def lab_text(seed: int, n_words: int) -> str:
    import random

    rng = random.Random(seed)
    sentences, n = [], 0
    while n < n_words:
        k = rng.randint(4, 10)
        sentences.append(" ".join(rng.choice(LAB_WORDS) for _ in range(k)).capitalize() + ".")
        n += k
    return " ".join(sentences)


@pytest.fixture(scope="session")
def lab_checkpoint(tmp_path_factory):
    """A small trained checkpoint for the lab's server and browser tests: a Harris tokenizer of
    40 segments fitted on sentences of a small vocabulary, and a 2-layer, d = 32 model trained on
    them for 60 AdamW steps (about a second), saved with its tokenizer."""
    from andrea.checkpoint import save_checkpoint
    from andrea.config import ModelConfig
    from andrea.model import ANDREA
    from andrea.tokenizer import HarrisTokenizer

    tok = HarrisTokenizer.train([lab_text(s, 400) for s in range(30)], 40)
    ids = torch.tensor(tok.encode(lab_text(99, 6000), bos=True))
    cfg = ModelConfig(vocab_size=tok.vocab_size, n_embd=32, n_head=2, n_layer=2, block_size=64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest
    torch.manual_seed(0)
    model = ANDREA(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        starts = torch.randint(0, len(ids) - 33, (8,), generator=gen)
        x = torch.stack([ids[s:s + 32] for s in starts])
        y = torch.stack([ids[s + 1:s + 33] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    path = tmp_path_factory.mktemp("lab") / "lab.safetensors"
    save_checkpoint(path, cfg, model.state_dict(), meta={"step": 60, "tokenizer": tok.to_dict(), "loss": loss.item()})
    return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A prepared data folder of two synthetic sources (alpha, beta) and a 40-segment tokenizer,
    for tiny training runs (tests/test_train.py, tests/test_growth.py)."""
    from test_train import synthetic_text

    from andrea.data import prepare
    from andrea.tokenizer import HarrisTokenizer

    root = tmp_path_factory.mktemp("train")
    for name, seed in (("alpha", 1), ("beta", 2)):
        (root / f"{name}.txt").write_text("\n\n".join(synthetic_text(seed, 60)))
    tok = HarrisTokenizer.train(synthetic_text(3, 40), 40)
    tok.save(root / "tok")
    prepare(tok, [str(root / "alpha.txt"), str(root / "beta.txt")], root / "data", log=lambda *a: None)
    return root / "data"
