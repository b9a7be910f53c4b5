"""The lab page in a real headless browser (Debian's chromium, driven by selenium): type a word and
read the neighbours, run attention on a prompt and find the grid, generate and see the tokens
appear, move the Growth view's step slider over a real run's snapshots, use every view, and fail
on any console error.

Needs chromium, chromium-driver and selenium; without them these tests are skipped with a note
(`apt-get install chromium chromium-driver` and `pip install -e '.[dev]'` enable them; .ci/run
installs the browser). One server and one browser serve the whole module.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from andrea.decoding.generate import generate_steps
from andrea.inside import embed
from andrea.inside.wordsim import LESSON_PAIRS

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
    return embed.load_subject(lab_checkpoint)


@pytest.fixture(scope="module")
def url(subject):
    from andrea.web.lab import LabServer

    server = LabServer(subject, "127.0.0.1", 0)
    yield server.start()
    server.stop()


@pytest.fixture(scope="module")
def growth_subject(growth_run):
    return embed.load_subject(growth_run[0])


@pytest.fixture(scope="module")
def growth_url(growth_run, growth_subject):
    """A second lab, on a tiny real run with embedding snapshots and the tiny word sets fetched."""
    from andrea.web.lab import LabServer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANDREA_CACHE", str(growth_run[1]))
        mp.setenv("ANDREA_WORDSETS", str(growth_run[1] / "wordsets"))
        server = LabServer(growth_subject, "127.0.0.1", 0)
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
    expected = embed.neighbours(subject.model, subject.tokenizer, "cat", 12, "cos", "input")["neighbours"]
    items = by_css(browser, "#token-input-list li")
    assert [int(li.get_attribute("data-id")) for li in items] == [n["id"] for n in expected]
    assert items[0].text.startswith(embed.show_piece(expected[0]["piece"]))
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
    steps = list(generate_steps(subject.model, subject.tokenizer, "the cat", max_new_tokens=12, temperature=0.8,
                                    top_k=40, seed=0))
    assert [int(s.get_attribute("data-id")) for s in spans] == [s["id"] for s in steps]
    assert float(spans[0].get_attribute("data-prob")) == pytest.approx(steps[0]["prob"], abs=1e-6)
    assert shots.text_of(browser, "gen-status") == f"{len(steps)} tokens."
    spans[0].click()
    assert "sampled" in shots.text_of(browser, "gen-detail")


@pytest.mark.allow_400
def test_every_view_loads(browser, url):
    states = shots.show_each_view(browser, url, words=("cat",), prompt="the cat sat on a mat")
    # a bare model file has no training text for the Layers view, and the page says so
    assert states == {v: "error" if v == "layers" else "ready" for v in shots.VIEWS} and shots.VIEWS[0] == "lesson"
    assert "that is not known here" in by_css(browser, "#layers-error")[0].get_attribute("textContent")
    assert len(by_css(browser, '#lesson-steps[data-walk="block"] li')) == 8  # the block walk, the Lesson tab's last
    assert len(by_css(browser, "#compare-results .card")) == len(LESSON_PAIRS)
    assert "cat·dog" in by_css(browser, "#compare-verdict")[0].get_attribute("textContent")  # the view is hidden now
    assert by_css(browser, "#map-plot .scatterlayer .point")
    assert by_css(browser, "#positions-heatmap .main-svg")
    rows = by_css(browser, "#lens-table tbody tr")
    assert [r.find_elements("css selector", "th")[0].get_attribute("textContent") for r in rows] == ["embedding", "block 1", "block 2"]


def test_the_lesson_tab_offers_the_three_walks_and_draws_their_figures(browser, url, subject):
    from andrea.inside.lessons import attention, block

    shots.open_view(browser, url, "lesson")
    assert shots.wait_view_loaded(browser, "lesson") == "ready"
    by_css(browser, "#lesson-walk-embedding")[0].click()  # the walk a view before may have left another open
    assert shots.wait_for(browser, lambda d: by_css(d, '#lesson-steps[data-walk="embedding"]')
                          and shots.state(d, "lesson") == "ready", 60)
    assert by_css(browser, '#lesson-steps li[data-key="pairs"] .main-svg')  # the pairs against the random band
    by_css(browser, "#lesson-walk-attention")[0].click()
    assert shots.wait_for(browser, lambda d: by_css(d, '#lesson-steps[data-walk="attention"]')
                          and shots.state(d, "lesson") == "ready", 60)
    items = by_css(browser, "#lesson-steps li")
    assert [li.get_attribute("data-key") for li in items] == [f.__name__.removeprefix("step_") for f in attention.STEPS]
    assert len(by_css(browser, '#lesson-steps li[data-key="scores"] .heatmaplayer image, '
                                '#lesson-steps li[data-key="scores"] .hm')) >= 1  # scores, masked, softmax
    cfg = subject.model.config
    assert len(by_css(browser, '#lesson-steps li[data-key="heads"] canvas')) == cfg.n_layer * cfg.n_head
    verdict = by_css(browser, '#lesson-steps li[data-key="ablation"] .verdict')[0].text
    assert verdict.startswith("cannot check")  # a bare model file: no held-out text, and no figure
    assert not by_css(browser, '#lesson-steps li[data-key="ablation"] .main-svg')
    by_css(browser, "#lesson-walk-block")[0].click()
    assert shots.wait_for(browser, lambda d: by_css(d, '#lesson-steps[data-walk="block"]')
                          and shots.state(d, "lesson") == "ready", 120)
    items = by_css(browser, "#lesson-steps li")
    assert [li.get_attribute("data-key") for li in items] == [f.__name__.removeprefix("step_") for f in block.STEPS]
    assert by_css(browser, '#lesson-steps li[data-key="mlp"] .heatmaplayer image, #lesson-steps li[data-key="mlp"] .hm')
    for key in ("stream", "head", "params"):  # the stream's size by block, cat's output neighbours, the shares
        assert by_css(browser, f'#lesson-steps li[data-key="{key}"] .main-svg'), key
    for key in ("lens", "removal"):  # a bare model file: no held-out text, and no figure
        assert by_css(browser, f'#lesson-steps li[data-key="{key}"] .verdict')[0].text.startswith("cannot check")
        assert not by_css(browser, f'#lesson-steps li[data-key="{key}"] .main-svg')
    by_css(browser, "#lesson-walk-embedding")[0].click()
    assert shots.wait_for(browser, lambda d: by_css(d, '#lesson-steps[data-walk="embedding"]'), 30)
    assert len(by_css(browser, "#lesson-steps li")) == 9


def test_the_layers_view_draws_each_block_beside_the_tables(browser, growth_url, growth_subject):
    shots.open_view(browser, growth_url, "layers")
    assert shots.wait_view_loaded(browser, "layers", 120) == "ready"
    L = growth_subject.model.config.n_layer
    head = [th.get_attribute("textContent") for th in by_css(browser, "#layers-table tr:first-child th")]
    assert head == ["set", "pairs", "input table", *[f"block {i}" for i in range(1, L + 1)], "output head"]
    assert [tr.get_attribute("data-set") for tr in by_css(browser, "#layers-table tr[data-set]")] == ["simlex999", "wordsim353"]
    for name in ("simlex999", "wordsim353"):
        assert len(by_css(browser, f"#layers-{name} .bars .point")) == L + 2  # a bar for each block and table


@pytest.mark.allow_400
def test_errors_are_shown_on_the_page(browser, url):
    shots.open_view(browser, url, "token")
    shots.fill(browser, "token-word", "#99999")
    assert shots.submit(browser, "token", "token-go") == "error"
    assert "out of range" in shots.text_of(browser, "token-error")
    shots.open_view(browser, url, "lens")
    shots.fill(browser, "lens-prompt", "the cat " * 40)
    assert shots.submit(browser, "lens", "lens-go") == "error"
    assert "give a shorter prompt" in shots.text_of(browser, "lens-error")


def neighbour_ids(browser):
    return [int(li.get_attribute("data-id")) for li in by_css(browser, "#growth-neighbours li")]


def map_points(browser):
    """The map's points as plotly holds them after the last move: (x, y) per word."""
    return np.array(browser.execute_script("const d = document.getElementById('growth-map').data[0]; return [d.x, d.y];")).T


def test_the_growth_slider_changes_what_is_shown(browser, growth_url, growth_run, growth_subject):
    from andrea.snapshots.timeline import WHY_UNSEEN, Timeline, aligned_map, neighbours_at, row_updates

    tl = Timeline(growth_run[0], growth_subject.tokenizer)
    shots.open_view(browser, growth_url, "growth")
    assert shots.wait_view_loaded(browser, "growth") == "ready"
    slider = by_css(browser, "#growth-step")[0]
    assert slider.get_attribute("max") == str(len(tl.steps) - 1) and slider.get_attribute("value") == str(len(tl.steps) - 1)
    assert shots.text_of(browser, "growth-step-label") == f"step 16 · snapshot {len(tl.steps)} of {len(tl.steps)}"
    # each head's scores over the steps, kept with each snapshot (andrea.inside.heads), next to the loss
    assert shots.wait_for(browser, lambda d: by_css(d, "#growth-heads .main-svg") and by_css(d, "#growth-loss .main-svg"), 30)
    assert len(by_css(browser, "#growth-heads .scatterlayer .trace")) == 2 * 2  # blocks × heads
    # the last step: neighbours, map and the last interval's updates are the library's
    last = neighbours_at(tl, 16, "cat", 10)
    assert neighbour_ids(browser) == [n["id"] for n in last["neighbours"]]
    words = browser.execute_script("return document.getElementById('growth-map').data[0].text")
    frames = np.array(aligned_map(tl, words)["frames"])
    np.testing.assert_allclose(map_points(browser), frames[-1], atol=1e-9)
    updates = row_updates(tl, 8, 16)
    assert shots.text_of(browser, "growth-why") == WHY_UNSEEN["v2"] == updates["why"]
    names = [t.text for t in by_css(browser, "#growth-updates .legendtext")]
    assert names == [f"seen in the batches ({updates['groups']['seen']['tokens']})",
                     f"in no batch ({updates['groups']['unseen']['tokens']})"]
    # the curves: the lesson's pairs inside the ±1/√d band, ρ on both sets, each with the step marked
    assert [t.text for t in by_css(browser, "#growth-pairs .legendtext")] == ["·".join(p) for p in LESSON_PAIRS]
    assert [t.text for t in by_css(browser, "#growth-rho .legendtext")] == ["SimLex-999 (n 8)", "WordSim-353 (n 6)"]
    assert "±1/√d = ±0.177" in shots.text_of(browser, "growth-pairs-note")
    assert len(by_css(browser, "#growth-pairs .shapelayer path")) == 2  # the band and the step's mark
    assert len(by_css(browser, "#growth-rho .shapelayer path")) == 3  # two null spreads and the mark
    mark = lambda: [p.get_attribute("d") for p in by_css(browser, "#growth-pairs .shapelayer path")][-1]  # noqa: E731
    before = mark()

    # the user takes the slider to the initialisation, with the keyboard
    from selenium.webdriver.common.keys import Keys

    slider.send_keys(Keys.HOME)
    assert shots.wait_for(browser, lambda d: d.execute_script("return document.getElementById('growth').dataset.step") == "0"
                          and shots.state(d, "growth") == "ready", 30, "the panels of step 0")
    assert shots.text_of(browser, "growth-step-label") == f"step 0 (the initialisation) · snapshot 1 of {len(tl.steps)}"
    first = neighbours_at(tl, 0, "cat", 10)
    assert [n["id"] for n in first["neighbours"]] != [n["id"] for n in last["neighbours"]]  # the table learned
    assert neighbour_ids(browser) == [n["id"] for n in first["neighbours"]]
    assert shots.wait_for(browser, lambda d: d.execute_script("return document.getElementById('growth-map').dataset.step") == "0",
                          30, "the map to move")
    np.testing.assert_allclose(map_points(browser), frames[0], atol=1e-9)
    assert mark() != before
    updates = row_updates(tl, 0, 1)
    assert by_css(browser, "#growth-updates")[0].get_attribute("data-interval") == "0-1"
    assert [t.text for t in by_css(browser, "#growth-updates .legendtext")][0] == \
        f"seen in the batches ({updates['groups']['seen']['tokens']})"

    # the fourth snapshot (what the screenshot script does), then a wider interval for the sparse-update panel
    assert shots.slide_to(browser, 3) == "ready"
    assert browser.execute_script("return document.getElementById('growth').dataset.step") == "4"
    assert by_css(browser, "#growth-updates")[0].get_attribute("data-interval") == "2-4"
    from selenium.webdriver.support.ui import Select

    Select(by_css(browser, "#growth-from")[0]).select_by_value("0")
    assert shots.wait_for(browser, lambda d: by_css(d, "#growth-updates")[0].get_attribute("data-interval") == "0-4", 30)
    steps = row_updates(tl, 0, 4)["steps"]
    assert f"to step 4 ({steps} steps, input table)" == shots.text_of(browser, "growth-interval")


def test_the_growth_view_tells_a_run_without_snapshots_what_to_do(browser, url, lab_checkpoint):
    shots.open_view(browser, url, "growth")
    assert shots.wait_view_loaded(browser, "growth") == "ready"
    note = shots.text_of(browser, "growth-absent")
    assert note.startswith(f"the checkpoint {lab_checkpoint} has no embedding snapshots")
    assert "andrea lab --checkpoint RUN" in note
    assert not by_css(browser, "#growth-live")[0].is_displayed()
