"""The code's shape, as a newcomer reads it: no two modules import each other (directly or round
a longer loop, at the top or inside a function), no module over 600 lines, no function over 80."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "andrea"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the andrea modules it imports anywhere in its text (a name imported from a
    package counts as the module of that name when there is one)."""
    mods = modules()
    graph = {m: set() for m in mods}
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            graph[m] |= {n for n in names if n in mods and n != m}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_is_over_600_lines_and_no_function_over_80():
    long_modules, long_functions = [], []
    for name, f in modules().items():
        text = f.read_text(encoding="utf-8")
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{name} ({text.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name} ({n} lines)")
    assert long_modules == [] and long_functions == []


# A module whose tests are not in tests/test_<its name>.py, and the files that test it: a command's
# module is tested where its command is run; a module every command uses, where its users are.
COVERED_BY = {
    "andrea.cli.common": ["test_cli.py", "test_cli_flags.py"],
    "andrea.cli.convert": ["test_formats.py", "test_hf.py"],
    "andrea.cli.data": ["test_corpus.py", "test_wordsim.py"],
    "andrea.cli.doctor": ["test_processor.py"],
    "andrea.cli.experiment": ["test_experiments_positions.py", "test_experiments_sparse_updates.py"],
    "andrea.cli.lab": ["test_web_lab.py"],
    "andrea.cli.lesson": ["test_lessons_embedding.py", "test_lessons_attention.py", "test_lessons_block.py"],
    "andrea.cli.serve": ["test_web_api.py"],
    "andrea.cli.similarity": ["test_wordsim.py", "test_context_vectors.py"],
    "andrea.config": ["test_params.py", "test_model.py"],
    "andrea.corpus.fetched": ["test_corpus.py"],
    "andrea.corpus.readers": ["test_corpus.py", "test_rdata.py"],
    "andrea.corpus.registry": ["test_corpus.py"],
    "andrea.decoding.batching": ["test_web_api.py"],
    "andrea.distributed": ["test_train.py"],
    "andrea.errors": ["test_cli.py"],
    "andrea.formats.bin": ["test_formats.py"],
    "andrea.formats.common": ["test_formats.py", "test_hf.py"],
    "andrea.formats.portable": ["test_formats.py"],
    "andrea.formats.projector": ["test_formats.py", "test_embed.py"],
    "andrea.formats.remote.tokenization_andrea": ["test_hf.py"],
    "andrea.inside.lessons.report": ["test_lessons_embedding.py", "test_lessons_attention.py", "test_lessons_block.py"],
    "andrea.mainjob_settings": ["test_mainjob.py"],
    "andrea.memory": ["test_params.py", "test_train.py"],
    "andrea.optim_state": ["test_train.py", "test_formats.py"],
    "andrea.positions": ["test_embed.py", "test_model.py"],
    "andrea.snapshots.observers": ["test_snapshots.py"],
    "andrea.snapshots.store": ["test_snapshots.py"],
    "andrea.snapshots.timeline": ["test_snapshots.py"],
    "andrea.tokenizer.harris": ["test_tokenizer.py"],
    "andrea.tokenizer.sample": ["test_audit.py", "test_tokenizer_train.py"],
    "andrea.tokenizer.words": ["test_word_ends.py"],
    "andrea.web.common": ["test_web_lab.py", "test_web_lab_growth.py"],
    "andrea.web.protocol": ["test_web_api.py"],
}


def test_every_module_has_a_test_file_of_its_name_or_says_where_it_is_tested():
    """tests/test_<name>.py, the name the module's path (andrea/decoding/plan.py: test_plan.py or
    test_decoding_plan.py), or else an entry in COVERED_BY naming files that exist."""
    tests = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    unnamed = []
    for name, path in modules().items():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        parts = name.split(".")[1:]
        if not {f"test_{'_'.join(parts[i:])}.py" for i in range(len(parts))} & tests:
            unnamed.append(name)
    assert sorted(unnamed) == sorted(COVERED_BY), "a module without tests/test_<name>.py must be named in COVERED_BY"
    assert all(f in tests for files in COVERED_BY.values() for f in files)


def test_the_training_loop_enters_no_lab_module():
    """What a run computes at its snapshots (the heads' scores, the word scores) comes from the
    looking-inside modules it needs, never the lab's views or the lab's table module."""
    import subprocess
    import sys

    code = "import sys, andrea.train; print(' '.join(m for m in sys.modules if m.startswith('andrea.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "andrea.train" in loaded and "andrea.inside.heads" in loaded
    assert not [m for m in loaded if m.startswith(("andrea.web", "andrea.inside.embed", "andrea.inside.blocks",
                                                   "andrea.inside.lessons"))]
