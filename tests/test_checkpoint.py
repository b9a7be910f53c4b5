"""andrea.checkpoint: its behaviour, and its promises under hostile input."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    DEEP,
    LONG_INT,
    cli,
    copy_text_run,
    file_values,
    meta_cases,
    one_sentence,
    rewrite,
    snapshot,
    tensor_cases,
    text_train_args,
)
from safetensors import safe_open
from safetensors.torch import save_file

from andrea.config import ModelConfig, count_params
from andrea.errors import AndreaError

# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
@pytest.mark.parametrize("family", ["tensors", "metadata"])
def test_every_damaged_field_ends_cleanly_in_every_reader(text_data, text_model_json, text_run, tmp_path, capsys, built_models,
                                                          family):
    """Each tensor (wrong shape, wrong dtype, NaN, missing, extra) and each metadata field (missing,
    of the wrong type, absurd values, absurd configs) of a real checkpoint, damaged in turn, given
    to andrea.load, generate, convert and train --resume: each either works or ends in one
    sentence with exit 2; none builds a model larger than the file truthfully holds."""
    import andrea

    source = text_run / "latest.safetensors"
    truthful = count_params(ModelConfig.load(text_model_json))
    cases = tensor_cases(source) if family == "tensors" else meta_cases(source)
    assert len(cases) > 50
    refused, accepted = 0, []
    for i, (label, tensors, meta) in enumerate(cases):
        folder = tmp_path / f"c{i}"
        folder.mkdir()
        bad = rewrite(source, tensors, meta, dst=folder / "latest.safetensors")
        bound = max(truthful, file_values(bad))
        built_models.clear()
        try:
            andrea.load(bad)
        except AndreaError:
            refused += 1
        code, _, err = cli(capsys, "generate", "--checkpoint", bad, "--prompt", "the", "--max-new-tokens", "3", "--seed", "1")
        assert code == 0 or one_sentence(code, err), label
        code, _, err = cli(capsys, "convert", bad, folder / "model.json")
        assert code == 0 or one_sentence(code, err), label
        code, _, err = cli(capsys, *text_train_args(text_data, text_model_json, folder, "--resume", steps=5))
        assert code == 0 or one_sentence(code, err), label
        if code == 0:
            accepted.append(label)
        assert all(n <= bound for n in built_models), (label, built_models, bound)
    print(len(cases), "cases", refused, "refused by andrea.load; train --resume accepted:", accepted)

@pytest.mark.hostile
def test_a_config_claiming_a_huge_model_is_refused_without_allocating(text_run, tmp_path):
    """vocab 10^9 and 10^6 layers in a small file: refused by arithmetic, in a fresh process whose
    peak memory is measured (the model that config claims would need terabytes)."""
    bad = rewrite(text_run / "latest.safetensors", meta=lambda m: m["config"].update(vocab_size=10**9, n_layer=10**6),
                  dst=tmp_path / "huge.safetensors")
    # the peak is the process's own high-water mark (VmHWM): ru_maxrss would also count the pages of
    # the forked test process it was started from
    code = ("import sys\nfrom andrea.cli import main\n"
            f"status = main(['generate', '--checkpoint', {str(bad)!r}, '--prompt', 'the'])\n"
            "hwm = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
            "print('peak', int(hwm) * 1024, file=sys.stderr)\n"
            "sys.exit(status)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    err = done.stderr.splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert err[0].startswith("andrea: error: ") and "describes a model of" in err[0]
    peak = int(err[1].split()[1])
    assert peak < 1_000_000_000, f"peak {peak:,} bytes"  # the interpreter with torch loaded is most of it

@pytest.mark.hostile
@pytest.mark.parametrize("code_, words", [(errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system"),
                                          (errno.EACCES, "Permission denied")])
def test_a_failing_write_keeps_the_last_checkpoint_whole(text_data, text_model_json, text_run, tmp_path, capsys, monkeypatch,
                                                         code_, words):
    """The disk fills (or turns read-only, or refuses) while a checkpoint is written: the write
    stops half-way, the run ends in one sentence, and the checkpoints before it are byte-identical."""
    import andrea.checkpoint

    out = copy_text_run(text_run, tmp_path / "r")
    before = snapshot(out)

    def failing_save(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a checkpoint")
        raise OSError(code_, os.strerror(code_), filename)

    monkeypatch.setattr(andrea.checkpoint, "save_file", failing_save)
    code, _, err = cli(capsys, *text_train_args(text_data, text_model_json, out, "--resume", steps=6))
    line = one_sentence(code, err)
    # the first file the resumed run writes: best.safetensors after an evaluation, or latest
    assert any(f"could not write {out / name} ({words}); it is as it was" in line
               for name in ("latest.safetensors", "best.safetensors")), line
    assert snapshot(out) == before
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    monkeypatch.undo()
    assert cli(capsys, *text_train_args(text_data, text_model_json, out, "--resume", steps=6))[0] == 0

@pytest.mark.hostile
def test_a_real_write_failure_from_the_kernel(text_data, text_model_json, text_run, tmp_path):
    """The same through the real writer: a fresh process whose files may not grow past 64 KiB
    (RLIMIT_FSIZE makes the kernel fail the write with EFBIG, as a full disk fails it)."""
    out = copy_text_run(text_run, tmp_path / "r")
    before = snapshot(out)
    code = ("import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\nfrom andrea.cli import main\n"
            f"sys.exit(main({[str(a) for a in text_train_args(text_data, text_model_json, out, '--resume', steps=6)]!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    assert any(f"could not write {out / name} (File too large)" in last for name in ("latest.safetensors", "best.safetensors")), last
    assert snapshot(out) == before and not [p for p in out.iterdir() if ".tmp-" in p.name]

@pytest.mark.hostile
def test_a_checkpoint_whose_metadata_holds_python_limits_ends_in_one_sentence(audited_run, tmp_path, capsys):
    with safe_open(str(audited_run / "latest.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()["andrea"]
    for i, value in enumerate((LONG_INT, DEEP)):
        bad = tmp_path / f"c{i}.safetensors"
        save_file(tensors, str(bad), metadata={"andrea": meta[:-1] + ', "x": ' + value + "}"})
        line = one_sentence(*cli(capsys, "generate", "--checkpoint", bad, "--prompt", "a")[::2])
        assert str(bad) in line and ("4,300 digits" in line or "nests its JSON" in line), line
