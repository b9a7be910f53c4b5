import random
from pathlib import Path

import pytest
import torch
from helpers import (SET_WORDS, audited_train_args, documents, opts, read_meta, root_train_args, short_documents,
                     text_train_args, tiny_config)

from andrea.cli import main
from andrea.config import ModelConfig, count_params
from andrea.prepare import prepare
from andrea.shards import TokenData
from andrea.tokenizer.train import train_tokenizer
from andrea.train import train


@pytest.fixture(autouse=True)
def subnormals_as_the_processor_keeps_them():
    """`andrea train` and the main job flush subnormal floats to zero for the rest of their process
    (andrea.processor), Python's own floats included; after each test this thread keeps them again,
    as hypothesis's float strategies require."""
    yield
    torch.set_flush_denormal(False)


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
    from andrea.tokenizer.train import train_tokenizer

    tok = train_tokenizer([lab_text(s, 400) for s in range(30)], 40)
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
    for tiny training runs (tests/test_train.py, tests/test_snapshots.py)."""
    from helpers import synthetic_text

    from andrea.prepare import prepare
    from andrea.tokenizer.train import train_tokenizer

    root = tmp_path_factory.mktemp("train")
    for name, seed in (("alpha", 1), ("beta", 2)):
        (root / f"{name}.txt").write_text("\n\n".join(synthetic_text(seed, 60)))
    tok = train_tokenizer(synthetic_text(3, 40), 40)
    tok.save(root / "tok")
    prepare(tok, [str(root / "alpha.txt"), str(root / "beta.txt")], root / "data", log=lambda *a: None)
    return root / "data"


TINY_WORDSETS = {
    "simlex999.txt": "# a tiny stand-in for SimLex-999\n# Word 1\tWord 2\tHuman (mean)\n"
                     "cat\tdog\t7.5\ncat\tpet\t6.0\ndog\tpet\t6.5\nkings\tqueens\t8.0\nsat\tran\t3.0\n"
                     "old\tideas\t1.0\nmat\tthings\t2.0\ntalked\trethinking\t3.5\n",
    "wordsim353.tsv": "# a tiny stand-in for WordSim-353\n# Word 1\tWord 2\tHuman (mean)\n"
                      "cat\tmat\t5.0\ndog\towner\t7.0\npet\towner\t7.5\nkings\tthings\t1.5\nold\tquickly\t1.0\n"
                      "ideas\trethinking\t7.0\n",
    "questions-words.txt": ": family\nkings queens cat dog\ncat dog kings queens\n",
}


def write_tiny_wordsets(cache) -> None:
    """Files of the word-similarity sets' formats in cache/wordsets/, as `andrea data fetch
    wordsets` leaves them (with a meta.json), holding a few pairs of the lab's words."""
    import json
    from pathlib import Path

    folder = Path(cache) / "wordsets"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in TINY_WORDSETS.items():
        (folder / name).write_text(text)
    (folder / "meta.json").write_text(json.dumps({"package": "tiny stand-in for the tests"}))


def train_tiny_run(root, recipe: str = "v2", max_steps: int = 16, eval_every: int = 8):
    """A real run of `andrea.train.train` with embedding snapshots: a Harris tokenizer of 40
    segments on sentences of the lab's words, a 2-layer d = 32 model, `max_steps` steps of 4
    sequences of 32 tokens. Returns the run folder."""
    from andrea.config import ModelConfig
    from andrea.prepare import prepare
    from andrea.tokenizer.train import train_tokenizer
    from andrea.train import train
    from andrea.trainconfig import TrainConfig

    for name, seed in (("alpha", 1), ("beta", 2)):
        (root / f"{name}.txt").write_text("\n\n".join(lab_text(seed * 100 + i, 400) for i in range(30)))
    tok = train_tokenizer([lab_text(s, 400) for s in range(30)], 40)
    prepare(tok, [str(root / "alpha.txt"), str(root / "beta.txt")], root / "data", log=lambda *a: None)
    cfg = ModelConfig(vocab_size=TokenData(root / "data").vocab_size, n_embd=32, n_head=2, n_layer=2, block_size=32)
    opts = TrainConfig(batch_size=4, seq_len=32, max_steps=max_steps, eval_every=eval_every, checkpoint_every=max_steps,
                       warmup_steps=2, eval_windows=2, seed=7, lr=3e-3, sampling="uniform", recipe=recipe)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(cfg, opts, root / "data", root / "run", log=lambda *a: None, progress=False)
    finally:
        torch.set_num_threads(threads)
    return root / "run"


@pytest.fixture(scope="session")
def make_tiny_run():
    """`train_tiny_run`, for a test that needs a run of its own."""
    return train_tiny_run


@pytest.fixture(scope="session")
def growth_run(tmp_path_factory):
    """A tiny real run with embedding snapshots (steps 0, 1, 2, 4, 8, 16; about 2 s), trained with the
    tiny word sets in its cache; (run folder, that cache). A lab started with ANDREA_CACHE set to
    the cache finds the sets fetched."""
    root = tmp_path_factory.mktemp("growth")
    cache = root / "cache"
    write_tiny_wordsets(cache)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANDREA_CACHE", str(cache))
        mp.setenv("ANDREA_WORDSETS", str(cache / "wordsets"))  # sets of one's own: the fetched ones are pinned
        run = train_tiny_run(root)
    return run, cache

# ---------------------------------------------------------------- the hostile-input tests' runs


def prepared_folder(root: Path, texts: dict[str, list[str]], fit_on: list[str]) -> Path:
    """root/data: each named text a source, prepared with a 20-segment tokenizer fitted on fit_on;
    root/model.json: a 1-layer, d = 32 model of its vocabulary."""
    for name, docs in texts.items():
        (root / f"{name}.txt").write_text("\n\n".join(docs))
    tok = train_tokenizer(fit_on, 20)
    prepare(tok, [str(root / f"{name}.txt") for name in texts], root / "data", log=lambda *a: None, progress=False)
    ModelConfig(vocab_size=tok.vocab_size, n_embd=32, n_head=2, n_layer=1, block_size=32).save(root / "model.json")
    return root / "data"


@pytest.fixture(scope="session")
def text_data(tmp_path_factory) -> Path:
    """One source, `text`, of 60 documents."""
    return prepared_folder(tmp_path_factory.mktemp("text"), {"text": documents(1, 60)}, documents(2, 30))


@pytest.fixture(scope="session")
def text_model_json(text_data) -> Path:
    return text_data.parent / "model.json"


@pytest.fixture(scope="session")
def text_run(text_data, text_model_json, tmp_path_factory) -> Path:
    """A real, healthy run of 4 steps: latest and best at step 4."""
    out = tmp_path_factory.mktemp("run") / "r"
    assert main(text_train_args(text_data, text_model_json, out)) == 0
    return out


@pytest.fixture
def built_models():
    """Parameter counts of every model built on a real device (not the meta device)."""
    from andrea.model import ANDREA

    built = []
    real_init = ANDREA.__init__

    def recording_init(self, cfg):
        if torch.get_default_device().type != "meta":
            built.append(count_params(cfg))
        real_init(self, cfg)

    ANDREA.__init__ = recording_init
    yield built
    ANDREA.__init__ = real_init


@pytest.fixture(scope="session")
def two_source_data(tmp_path_factory) -> Path:
    """Two sources, `north` and `south`, of 40 shorter documents each."""
    return prepared_folder(tmp_path_factory.mktemp("two"), {"north": short_documents(1, 40), "south": short_documents(3, 40)},
                           short_documents(2, 30))


@pytest.fixture(scope="session")
def two_source_model_json(two_source_data) -> Path:
    return two_source_data.parent / "model.json"


@pytest.fixture(scope="session")
def audited_run(two_source_data, two_source_model_json, tmp_path_factory) -> Path:
    """A healthy run of 4 steps over two sources: its checkpoints hold a curriculum and an audit."""
    out = tmp_path_factory.mktemp("run") / "r"
    assert main([str(a) for a in audited_train_args(two_source_data, two_source_model_json, out)]) in (0, 3)
    meta = read_meta(out / "latest.safetensors")
    assert meta["curriculum"]["history"] and meta["audit"]["scores"]
    return out


@pytest.fixture(scope="session")
def small_tokenizer(tmp_path_factory) -> Path:
    return train_tokenizer(short_documents(2, 30), 20).save(tmp_path_factory.mktemp("tok") / "tok")


@pytest.fixture(scope="session")
def prepared_root(tmp_path_factory) -> Path:
    """A text source, its tokenizer, its prepared data folder and a model config."""
    prepared_root = tmp_path_factory.mktemp("hardening")
    (prepared_root / "text.txt").write_text("\n\n".join(documents(1, 60)))
    tok = train_tokenizer(documents(2, 30), 20)
    tok.save(prepared_root / "tok")
    prepare(tok, [str(prepared_root / "text.txt")], prepared_root / "data", log=lambda *a: None, progress=False)
    ModelConfig(vocab_size=tok.vocab_size, n_embd=32, n_head=2, n_layer=1, block_size=32).save(prepared_root / "model.json")
    return prepared_root


@pytest.fixture(scope="session")
def root_run(prepared_root) -> Path:
    out = prepared_root / "run"
    assert main([str(a) for a in root_train_args(prepared_root, out)]) == 0
    return out


@pytest.fixture
def wordsets(tmp_path, monkeypatch):
    """Small sets in the published files' formats, of words of the synthetic text (helpers.WORDS), in a
    cache of this test's own."""
    root = tmp_path / "cache" / "wordsets"
    root.mkdir(parents=True)
    (root / "meta.json").write_text("{}")
    (root / "simlex999.txt").write_text("# h\n" + "".join(f"{a}\t{b}\t{(i * 37) % 10}\n" for i, (a, b) in enumerate(
        (a, b) for a in SET_WORDS for b in SET_WORDS if a < b)))
    (root / "wordsim353.tsv").write_text("# h\ncat\tdog\t8\ncat\tmat\t2\nkings\tqueens\t9\nowner\tpet\t6\n")
    (root / "questions-words.txt").write_text(": s\nkings queens cat dog\n")
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ANDREA_WORDSETS", str(root))


# ---------------------------------------------------------------- a model that learned to look back (the lessons)


TOPIC_WORDS = ("red blue green pink gray white black brown cat dog cow pig hen fox owl bat one two six ten nine four five "
               "three oak elm ash fir yew pine palm lime bread milk rice soup cake corn bean plum ship boat car bus train "
               "bike van cart").split()
COMMON = "the a of and to in is it on at by as so we he she they them this that".split()


def copy_docs(seed: int, n: int, words: int = 200) -> list[str]:
    """Documents of common words in which one word of the document's own (drawn from 48) comes back
    three times in ten: once it has been seen, attending to it predicts it, so heads matter and late
    tokens are predicted better than early ones."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        w = rng.choice(TOPIC_WORDS)
        docs.append(" ".join(w if rng.random() < 0.3 else rng.choice(COMMON) for _ in range(words)))
    return docs


@pytest.fixture(scope="session")
def copy_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("copy")
    for name, seed in (("alpha", 1), ("beta", 2)):
        (root / f"{name}.txt").write_text("\n\n".join(copy_docs(seed, 120)))
    tok = train_tokenizer(copy_docs(3, 40), 40)
    tok.save(root / "tok")
    prepare(tok, [str(root / "alpha.txt"), str(root / "beta.txt")], root / "data", log=lambda *a: None)
    return root / "data"


@pytest.fixture(scope="session")
def trained(copy_data, tmp_path_factory):
    """A 2-layer model trained 1,000 steps (about 10 s) on the copy documents: it learns to look back."""
    run = tmp_path_factory.mktemp("attn") / "run"
    train(tiny_config(copy_data), opts(max_steps=1000, eval_every=1000, checkpoint_every=1000, warmup_steps=10,
                                       batch_size=8, micro_batch=8, snapshots=False, lr=1e-2),
          copy_data, run, log=lambda *a: None, progress=False)
    return run
