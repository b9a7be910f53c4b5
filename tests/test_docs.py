"""The documents cannot rot quietly: every relative link and #anchor in README.md and docs/ resolves,
the README's file tree lists exactly the modules under andrea/, and every figure the documents quote
from BENCHMARKS.md appears in the section they link to."""

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FIGURE = re.compile(r"(?<![\w.])[+\-−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.,])[+\-−]?\d+\.\d+(?![\w.])")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def outside_fences(text: str) -> list[str]:
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in outside_fences(path.read_text(encoding="utf-8")):
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return found


def links(path: Path) -> list[str]:
    return [m.group(1) for line in outside_fences(path.read_text(encoding="utf-8")) for m in LINK.finditer(line)]


def test_the_slug_rule_matches_githubs():
    assert slug("The main job's peak learning rate at a fixed step budget") == "the-main-jobs-peak-learning-rate-at-a-fixed-step-budget"
    assert slug("Preparing a multi-GB corpus: andrea prepare against encode_batch") == \
        "preparing-a-multi-gb-corpus-andrea-prepare-against-encode_batch"
    assert slug("Training step against transformers' GPT-2") == "training-step-against-transformers-gpt-2"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(doc):
    broken = []
    for target in links(doc):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{doc.name}: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    missing = [p.name for p in DOCS[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def readme_tree(folder: str | None = None) -> list[str]:
    """The entries the README's tree lists under andrea/ (or under andrea/FOLDER, indented once more)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Files", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    start = lines.index("andrea/")
    entries, under = [], None
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        if not line.startswith("   "):
            under = line.split()[0]
            entries += [under] if folder is None else []
        elif line.startswith("    ") and not line.startswith("     ") and folder is not None and under == folder + "/":
            entries.append(line.split()[0])
    return entries


def test_the_readme_file_tree_lists_every_module_and_nothing_else():
    package = ROOT / "andrea"
    actual = {p.name for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    actual |= {p.name for p in package.glob("*.c")}
    actual |= {p.name + "/" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    listed = readme_tree()
    assert len(listed) == len(set(listed)), "an entry is listed twice"
    assert set(listed) == actual, (f"listed but absent: {sorted(set(listed) - actual)}; "
                                   f"present but not listed: {sorted(actual - set(listed))}")


def test_the_readme_lists_every_module_of_the_looking_inside_folder():
    package = ROOT / "andrea" / "inside"
    actual = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    actual |= {p.name + "/" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert sorted(readme_tree("inside")) == sorted(actual)


def test_the_tree_reader_sees_the_tree():
    listed = readme_tree()
    assert "model.py" in listed and "cli/" in listed and len(listed) > 20


def benchmark_sections() -> dict[str, str]:
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    sections, current, fenced = {}, None, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            current = slug(line[3:])
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def normal(figure: str) -> str:
    return figure.replace("−", "-").lstrip("+")


def quoted_figures(text: str) -> list[str]:
    """The figures a paragraph states, its links' targets left out."""
    return FIGURE.findall(re.sub(r"\]\([^)]*\)", "]", text))


def quoting_paragraphs(doc: Path) -> list[tuple[str, list[str]]]:
    """(text, [BENCHMARKS anchors]) for each paragraph that links into BENCHMARKS.md; a fenced block
    just before such a paragraph is quoted by it too."""
    out, previous_block = [], ""
    for part in re.split(r"\n\s*\n", doc.read_text(encoding="utf-8")):
        if part.lstrip().startswith("```"):
            previous_block = part
            continue
        targets = [t.partition("#")[2] for t in LINK.findall(part) if t.partition("#")[0].endswith("BENCHMARKS.md")]
        targets = [t for t in targets if t]
        if targets:
            out.append((previous_block + "\n" + part, targets))
        previous_block = ""
    return out


@pytest.mark.parametrize("doc", [d for d in DOCS if d.name != "history.md"], ids=lambda p: p.name)
def test_quoted_figures_appear_in_the_benchmark_section_they_cite(doc):
    sections = benchmark_sections()
    missing = []
    for text, targets in quoting_paragraphs(doc):
        body = " ".join(sections.get(t, "") for t in targets).replace("−", "-")
        for figure in quoted_figures(text):
            if normal(figure) not in body:
                missing.append(f"{figure} (cites {', '.join(targets)})")
    assert not missing, f"{doc.name}: figures not in the cited sections: {missing}"


def quoting_documents(docs) -> dict[str, set[str]]:
    """{BENCHMARKS anchor: names of the documents with a paragraph that cites it and quotes one of
    its figures}."""
    sections, out = benchmark_sections(), {}
    for doc in docs:
        for text, targets in quoting_paragraphs(doc):
            figures = {normal(f) for f in quoted_figures(text)}
            for t in targets:
                body = sections.get(t, "").replace("−", "-")
                if any(f in body for f in figures):
                    out.setdefault(t, set()).add(doc.name)
    return out


def test_a_remeasurement_touches_at_most_one_document_beside_benchmarks():
    """A section's figures are quoted by at most one document (README.md or a docs page); the others
    link to it without figures, so re-running its script changes BENCHMARKS.md and that one."""
    shared = {t: sorted(names) for t, names in quoting_documents([d for d in DOCS if d.name != "history.md"]).items()
              if len(names) > 1}
    assert not shared, f"sections whose figures several documents quote: {shared}"


def test_the_one_quoter_check_can_fail(tmp_path):
    section = benchmark_sections()["the-main-job-andrea-main"]
    figure = FIGURE.findall(section.replace("−", "-"))[0]
    docs = []
    for name in ("a.md", "b.md"):
        (tmp_path / name).write_text(f"It measured {figure} ([bench](BENCHMARKS.md#the-main-job-andrea-main)).\n")
        docs.append(tmp_path / name)
    assert quoting_documents(docs) == {"the-main-job-andrea-main": {"a.md", "b.md"}}


def test_measured_figures_in_the_readme_cite_their_section():
    """A figure with two or more decimals is a measurement: its paragraph must cite BENCHMARKS.md."""
    quoted = {text for text, _ in quoting_paragraphs(ROOT / "README.md")}
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    loose = []
    for part in re.split(r"\n\s*\n", text):
        figures = re.findall(r"(?<![\w.=])(?<!Python )\d+\.\d{2,}(?![\d.])", part)  # not a version
        if figures and not any(part in q for q in quoted):
            loose.extend(figures)
    assert not loose, f"measured figures without a BENCHMARKS.md section: {loose}"


def test_the_figure_check_can_fail(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("It ran at 9,999.5 tokens/s ([bench](BENCHMARKS.md#the-main-job-andrea-main)).\n")
    sections = benchmark_sections()
    (text, targets), = quoting_paragraphs(doc)
    assert targets == ["the-main-job-andrea-main"]
    assert FIGURE.findall(text) == ["9,999.5"] and "9,999.5" not in sections[targets[0]]


def test_benchmarks_md_holds_at_most_500_lines():
    """The measured figures' one home stays readable: older measurements move to docs/history.md."""
    lines = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 500, f"BENCHMARKS.md has {lines} lines; move older sections to docs/history.md"
