"""benchmarks/run_all run as the README of benchmarks shows it, by its own `#!/usr/bin/env python3`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not Path("/usr/bin/python3").exists() or not (REPO / ".venv" / "bin" / "python").exists(),
                    reason="no system python3, or andrea set up elsewhere than the repository's .venv")
def test_run_all_finds_the_repositorys_python_when_the_path_has_none_with_andrea(tmp_path):
    """With only the system python3 on PATH (which need not have andrea), run_all --help still
    answers: it runs itself again with the repository's .venv python. Without a .venv it says so
    in one sentence."""
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(REPO / "benchmarks" / "run_all"), "--help"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: run_all"), done.stderr
    if subprocess.run(["/usr/bin/python3", "-c", "import andrea"], capture_output=True, env=env).returncode == 0:
        return  # this system python has andrea: nothing more to see
    shutil.copytree(REPO / "benchmarks", tmp_path / "benchmarks")  # a copy with no .venv beside it
    bare = subprocess.run([str(tmp_path / "benchmarks" / "run_all"), "--help"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert bare.returncode != 0 and "Traceback" not in bare.stderr
    assert bare.stderr == ("run_all: this python has no andrea; set it up with `bash scripts/setup.sh dev`, "
                           "then run .venv/bin/python benchmarks/run_all.\n")
