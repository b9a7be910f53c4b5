"""The lab page in a real headless browser (Debian's chromium, driven by selenium): type a word and
read the neighbours, run attention on a prompt and find the grid, generate and see the tokens
appear, use every view, and fail on any console error.

Needs chromium, chromium-driver and selenium; without them these tests are skipped with a note
(`apt-get install chromium chromium-driver` and `pip install -e '.[dev]'` enable them; .ci/run
installs the browser). One server and one browser serve the whole module.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from andrea import lab

_path = Path(__file__).resolve().parent.parent / "scripts" / "lab_screenshots.py"
_spec = importlib.util.spec_from_file_location("lab_screenshots", _path)
shots = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shots)

_found = shots.find_browser()
pytestmark = [
    pytest.mark.skipif(isinstance(_found, str), reason=f"browser tests skipped: {_found}; install it to run them "
                       "(.ci/run installs the browser)"),
    pytest.mark.usefixtures("one_thread"),
]


@pytest.fixture(scope="module")
def subject(lab_checkpoint):
    return lab.load_subject(lab_checkpoint)


@pytest.fixture(scope="module")
def url(subject):
    from andrea.web.server import LabServer

    server = LabServer(subject, "127.0.0.1", 0)
    yield server.start()
    server.stop()


@pytest.fixture(scope="module")
def browser():
    driver = shots.open_browser()
    yield driver
    driver.quit()


@pytest.fixture(autouse=True)
def no_console_errors(browser, request):
    """Every test ends with a clean console; a test that provokes an error response on purpose
    (status 400, which chromium logs) marks it with allow_400."""
    shots.console_errors(browser)  # start clean
    yield
    errors = shots.console_errors(browser)
    if request.node.get_closest_marker("allow_400"):
        errors = [e for e in errors if "status of 400" not in e]
    assert errors == []


def by_css(browser, css):
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, css)


def test_type_a_word_and_read_its_neighbours(browser, url, subject):
    shots.open_view(browser, url, "token")
    shots.fill(browser, "token-word", "cat")
    assert shots.submit(browser, "token", "token-go") == "ready"
    lookup = shots.text_of(browser, "token-lookup")
    assert "␣cat" in lookup and "word-initial" in lookup
    expected = lab.neighbors(subject.model, subject.tokenizer, "cat", 12, "cos", "input")["neighbors"]
    items = by_css(browser, "#token-input-list li")
    assert [int(li.get_attribute("data-id")) for li in items] == [n["id"] for n in expected]
    assert items[0].text.startswith(lab.show_piece(expected[0]["piece"]))
    # the bare piece, asked for
    by_css(browser, "#token-bare")[0].click()
    assert shots.submit(browser, "token", "token-go") == "ready"
    assert "bare piece" in shots.text_of(browser, "token-lookup")
    by_css(browser, "#token-bare")[0].click()
    # a neighbour is a link to its own row
    first = by_css(browser, "#token-input-list li")[0]
    first_id = first.get_attribute("data-id")
    first.find_element("css selector", "button").click()
    assert shots.wait_for(browser, lambda d: f'"#{first_id}" → token {first_id}' in shots.text_of(d, "token-lookup"), 30)


def test_attention_grid_for_a_prompt(browser, url, subject):
    shots.open_view(browser, url, "attention")
    shots.fill(browser, "attention-prompt", "the cat sat on a mat")
    assert shots.submit(browser, "attention", "attention-go") == "ready"
    cfg = subject.model.config
    assert len(by_css(browser, "#attention-grid canvas")) == cfg.n_layer * cfg.n_head
    assert by_css(browser, "#attention-detail .main-svg")  # plotly drew the chosen head
    ticks = [t.text for t in by_css(browser, "#attention-detail .xtick text")]
    assert "0:<BOS>" in ticks and any(t.endswith("␣cat") for t in ticks)
    by_css(browser, "#attention-grid figure")[-1].click()
    assert shots.wait_for(browser, lambda d: f"layer {cfg.n_layer}, head {cfg.n_head}" in shots.text_of(d, "attention-detail"), 30)


def test_generate_shows_the_library_tokens_as_they_come(browser, url, subject):
    shots.open_view(browser, url, "generate")
    shots.fill(browser, "gen-prompt", "the cat")
    shots.fill(browser, "gen-max", "12")
    assert shots.submit(browser, "generate", "gen-go") == "ready"
    spans = by_css(browser, "#gen-output .gen-token")
    steps = list(lab.generate_steps(subject.model, subject.tokenizer, "the cat", max_new_tokens=12, temperature=0.8,
                                    top_k=40, seed=0))
    assert [int(s.get_attribute("data-id")) for s in spans] == [s["id"] for s in steps]
    assert float(spans[0].get_attribute("data-prob")) == pytest.approx(steps[0]["prob"], abs=1e-6)
    assert shots.text_of(browser, "gen-status") == f"{len(steps)} tokens."
    spans[0].click()
    assert "sampled" in shots.text_of(browser, "gen-detail")


def test_every_view_loads(browser, url):
    states = shots.show_each_view(browser, url, words=("cat",), prompt="the cat sat on a mat")
    assert states == {v: "ready" for v in shots.VIEWS}
    assert len(by_css(browser, "#compare-results .card")) == 2
    assert "cat·dog" in by_css(browser, "#compare-verdict")[0].get_attribute("textContent")  # the view is hidden now
    assert by_css(browser, "#map-plot .scatterlayer .point")
    assert by_css(browser, "#positions-heatmap .main-svg")
    rows = by_css(browser, "#lens-table tbody tr")
    assert [r.find_elements("css selector", "th")[0].get_attribute("textContent") for r in rows] == ["embedding", "block 1", "block 2"]


@pytest.mark.allow_400
def test_errors_are_shown_on_the_page(browser, url):
    shots.open_view(browser, url, "token")
    shots.fill(browser, "token-word", "#99999")
    assert shots.submit(browser, "token", "token-go") == "error"
    assert "out of range" in shots.text_of(browser, "token-error")
    shots.open_view(browser, url, "lens")
    shots.fill(browser, "lens-prompt", "the cat " * 40)
    assert shots.submit(browser, "lens", "lens-go") == "error"
    assert "Give a shorter prompt" in shots.text_of(browser, "lens-error")
