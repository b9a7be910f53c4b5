"""andrea.signals and when its handlers are installed."""

import signal
import subprocess
import sys

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
