"""andrea.signals and when its handlers are installed."""

import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import ENV, copy_root_run, lock_holder, metric_rows, root_train_args, temp_files

from andrea.checkpoint import load_checkpoint
from andrea.signals import Signals


def test_the_command_line_reaches_the_signal_handlers_without_loading_torch():
    """`andrea train` installs its handlers right after parsing its arguments; a SIGUSR1 or
    SIGTERM during start-up is the run's to answer only if nothing before that loads torch (its
    import is most of a start-up's 1-2 s)."""
    code = ("import sys; from andrea.cli import build_parser; build_parser().parse_args(['train']); "
            "import andrea.signals; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


def test_the_package_names_load_on_first_use():
    code = "import sys, andrea; assert 'torch' not in sys.modules; print(andrea.count_params(andrea.get_preset('andrea-120m')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and int(out.stdout) > 0, out.stderr[-2000:]


def test_a_checkpoint_request_while_starting_waits_and_a_stop_request_ends_at_once():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    with Signals() as s:
        signal.raise_signal(signal.SIGUSR1)
        assert s.save_now and not s.stop
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            stopped = True
        else:
            stopped = False
        assert stopped
        s.running()
        signal.raise_signal(signal.SIGTERM)
        assert s.stop
    assert {sig: signal.getsignal(sig) for sig in before} == before  # the handlers before the run are back


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_sigusr1_during_start_up_is_a_checkpoint_request_not_the_end(prepared_root, root_run, tmp_path):
    """SIGUSR1 every 2 ms from the moment the resumed run holds its folder (it is still reading
    its checkpoint and building its model) until its first step: the run answers each with a
    checkpoint and trains to its end."""
    out = copy_root_run(root_run, tmp_path / "r")
    rows_before = len(metric_rows(out))
    proc = subprocess.Popen([sys.executable, "-m", "andrea", *root_train_args(prepared_root, out, "--resume", steps=8)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    sent = 0
    try:
        deadline = time.time() + 90
        while lock_holder(out) != str(proc.pid):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.001)
        while proc.poll() is None and len(metric_rows(out)) == rows_before:
            proc.send_signal(signal.SIGUSR1)
            sent += 1
            time.sleep(0.002)
        out_text, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err)
    assert sent > 0 and load_checkpoint(out / "latest.safetensors").step == 8

@pytest.mark.hostile
def test_sigterm_during_the_final_evaluation_and_save_changes_nothing(prepared_root, tmp_path):
    """SIGTERM once the final evaluation has begun (its row is in metrics.jsonl; loss.png and the
    final checkpoint are still to come): the run ends as it would have, its checkpoint whole."""
    out = tmp_path / "r"
    args = root_train_args(prepared_root, out, steps=6)
    args[args.index("--eval-every") + 1] = args[args.index("--checkpoint-every") + 1] = "1000"
    proc = subprocess.Popen([sys.executable, "-m", "andrea", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    try:
        deadline = time.time() + 120
        while not any("eval" in r for r in metric_rows(out)):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        stdout, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err)
    assert "validation:" in stdout and load_checkpoint(out / "latest.safetensors").step == 6
    assert (out / "loss.png").exists() and not temp_files(out)

@pytest.mark.hostile
def test_a_second_sigterm_during_the_last_save_does_not_lose_it(prepared_root, tmp_path):
    """SIGTERM every 2 ms once the run has stepped: the first asks for a stop, the rest arrive
    while the final checkpoint is written (no periodic one exists). The checkpoint of the step it
    stopped at is written whole and named; no temporary file stays. (A SIGTERM after that line
    may still end the process, the handlers gone: nothing is lost then.)"""
    out = tmp_path / "r"
    args = root_train_args(prepared_root, out, steps=100000)
    args[args.index("--eval-every") + 1] = args[args.index("--checkpoint-every") + 1] = "100000"
    proc = subprocess.Popen([sys.executable, "-m", "andrea", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    lines, said = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "stopped by a signal" in line:
                said.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.time() + 120
        while not metric_rows(out):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.001)
        while proc.poll() is None and not said.is_set():
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.002)
        proc.wait(timeout=120)
        reader.join(timeout=30)
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert "Traceback" not in err and said.is_set(), (proc.returncode, err, lines)
    assert proc.returncode in (0, -signal.SIGTERM)
    step = int("".join(lines).split("stopped by a signal at step ")[1].split(";")[0].replace(",", ""))
    assert load_checkpoint(out / "latest.safetensors").step == step and not temp_files(out)
