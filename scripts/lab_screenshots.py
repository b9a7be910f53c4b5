"""Screenshots of every view of `andrea lab`, taken in a real headless browser.

    python scripts/lab_screenshots.py --checkpoint runs/a [--out docs/lab] [--views growth,map]

Starts the lab server on a free loopback port, drives Debian's chromium (through selenium and
chromium-driver: `apt-get install chromium chromium-driver`, and selenium from the dev extra)
through each view as a user would (the Lesson tab's first walk and its block walk, type a word,
compare, draw a map, run attention and the logit lens on a prompt, generate, move the Growth
view's step slider), and saves one PNG per view
(`--views` takes only some). The Growth view shows a run's embedding snapshots: give the run
folder or a checkpoint inside it. It fails if the page logs any console error. The functions here
are also what tests/test_lab_browser.py drives the page with.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

VIEWS = ("lesson", "lesson-block", "params", "token", "compare", "map", "positions", "attention", "lens", "layers", "generate", "growth")
GROWTH_HEIGHT = 1600  # the Growth view's panels need a taller window than the others
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)


def find_browser() -> tuple[str, str] | str:
    """(browser, driver) paths, or a sentence saying what is missing and how to get it."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    browser = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    driver = next((p for p in map(shutil.which, DRIVER) if p), None)
    if not browser or not driver:
        return "no chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)"
    return browser, driver


def open_browser(width: int = 1360, height: int = 1000):
    """A headless chromium driven by selenium, with the page's console log kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_browser()
    if isinstance(found, str):
        raise RuntimeError(found)
    browser, driver = found
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--window-size={width},{height}", "--force-device-scale-factor=1", "--no-first-run",
                "--disable-extensions", "--disable-background-networking"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # the driver is named, so selenium never looks for (or downloads) one itself
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def console_errors(driver) -> list[str]:
    """The console's error messages since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(driver, condition, timeout: float = 30.0, what: str = "the page"):
    """Poll condition(driver) until it is truthy; its value, or TimeoutError naming what."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition(driver)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def state(driver, view: str) -> str | None:
    return driver.execute_script(f"return document.getElementById('{view}').dataset.state || null")


def open_view(driver, url: str, view: str) -> None:
    """Load the page (once) and switch to a view through its tab."""
    from selenium.webdriver.common.by import By

    if not driver.current_url.startswith(url):
        driver.get(url)
        wait_for(driver, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"), what="the page to start")
    driver.find_element(By.CSS_SELECTOR, f"nav button[data-view='{view}']").click()
    wait_for(driver, lambda d: d.find_element(By.ID, view).is_displayed(), what=f"the {view} view")


def submit(driver, view: str, button_id: str, timeout: float = 60.0) -> str:
    """Click a view's button and wait until the view has loaded or shown an error; the state."""
    from selenium.webdriver.common.by import By

    driver.execute_script(f"document.getElementById('{view}').dataset.state = ''")
    driver.find_element(By.ID, button_id).click()
    return wait_for(driver, lambda d: state(d, view) in ("ready", "error") and state(d, view), timeout, f"the {view} view to load")


def fill(driver, element_id: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, element_id)
    box.clear()
    box.send_keys(text)


def text_of(driver, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id).text


def wait_view_loaded(driver, view: str, timeout: float = 60.0) -> str:
    return wait_for(driver, lambda d: state(d, view) in ("ready", "error") and state(d, view), timeout, f"the {view} view to load")


def slide_to(driver, index: int, timeout: float = 60.0) -> str:
    """Move the Growth view's step slider to snapshot `index` with the keyboard, as a user would,
    and wait until its panels have loaded; the view's state."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    slider = driver.find_element(By.ID, "growth-step")
    slider.send_keys(Keys.HOME, *[Keys.ARROW_RIGHT] * index)
    step = driver.execute_script(f"return String(G.info.steps[{index}])")
    return wait_for(driver, lambda d: d.execute_script("return document.getElementById('growth').dataset.step") == step
                    and state(d, "growth") in ("ready", "error") and state(d, "growth"), timeout, f"the panels of step {step}")


def show_growth(driver, url: str, shoot) -> str:
    """The Growth view, its slider taken to a snapshot about two thirds of the way along."""
    from selenium.webdriver.common.by import By

    open_view(driver, url, "growth")
    result = wait_view_loaded(driver, "growth")
    if result == "ready" and driver.find_element(By.ID, "growth-live").is_displayed():
        n = int(driver.find_element(By.ID, "growth-step").get_attribute("max")) + 1
        result = slide_to(driver, max(0, (2 * n) // 3 - 1))
        driver.execute_script("document.activeElement.blur()")  # no focus ring on the slider
    size = driver.get_window_size()
    driver.set_window_size(size["width"], max(size["height"], GROWTH_HEIGHT))
    try:
        shoot("growth")
    finally:
        driver.set_window_size(size["width"], size["height"])
    return result


def show_each_view(driver, url: str, out_dir: Path | None = None, words=("cat", "dog", "pet"),
                   prompt: str = "I have a cat and a dog. On Tuesday we took them to the park.", views=VIEWS) -> dict[str, str]:
    """Use every view in `views` once as a user would; with out_dir, save a screenshot of each.
    The state each view ended in (ready or error)."""
    from selenium.webdriver.common.by import By

    states = {}

    def shoot(view):
        if out_dir is not None:
            time.sleep(0.6)  # let plotly finish its transitions
            driver.save_screenshot(str(out_dir / f"{view}.png"))

    def step(view, work):
        if view in views:
            states[view] = work()
            shoot(view)

    step("lesson", lambda: (open_view(driver, url, "lesson"), wait_view_loaded(driver, "lesson"))[1])

    def lesson_block():  # the Lesson tab's third walk, scrolled to the residual stream's picture
        open_view(driver, url, "lesson")
        wait_view_loaded(driver, "lesson")
        driver.find_element(By.ID, "lesson-walk-block").click()
        result = wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '#lesson-steps[data-walk="block"]')
                          and state(d, "lesson") in ("ready", "error") and state(d, "lesson"), 300, "the block lesson")
        driver.execute_script("document.querySelector('#lesson-steps li[data-key=\"mlp\"]').scrollIntoView()")
        return result

    step("lesson-block", lesson_block)
    step("params", lambda: (open_view(driver, url, "params"), wait_view_loaded(driver, "params"))[1])

    def token():
        open_view(driver, url, "token")
        fill(driver, "token-word", words[0])
        driver.find_element(By.ID, "token-whole").click()
        return submit(driver, "token", "token-go")

    step("token", token)

    def compare():
        open_view(driver, url, "compare")
        driver.find_element(By.ID, "compare-lesson").click()
        from andrea.inside.wordsim import LESSON_PAIRS

        return wait_for(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#compare-results .card")) == len(LESSON_PAIRS)
                        and state(d, "compare"), 60, "the lesson's comparisons")

    step("compare", compare)
    step("map", lambda: (open_view(driver, url, "map"), submit(driver, "map", "map-go"))[1])
    step("positions", lambda: (open_view(driver, url, "positions"), wait_view_loaded(driver, "positions"))[1])

    def prompted(view, button):
        open_view(driver, url, view)
        fill(driver, f"{view}-prompt", prompt)
        return submit(driver, view, button)

    step("attention", lambda: prompted("attention", "attention-go"))
    step("lens", lambda: prompted("lens", "lens-go"))
    step("layers", lambda: (open_view(driver, url, "layers"), wait_view_loaded(driver, "layers", 300))[1])

    def generate():
        open_view(driver, url, "generate")
        result = submit(driver, "generate", "gen-go", timeout=120)
        tokens = driver.find_elements(By.CSS_SELECTOR, "#gen-output .gen-token")
        if tokens:
            pick = tokens[min(len(tokens) - 1, 6)]
            driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", pick)
        return result

    step("generate", generate)
    if "growth" in views:
        states["growth"] = show_growth(driver, url, shoot)
    return states


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a checkpoint file or run folder")
    ap.add_argument("--out", default="docs/lab", help="where to write the PNGs (default docs/lab)")
    ap.add_argument("--width", type=int, default=1360)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--views", default=",".join(VIEWS), help=f"the views to take, by name (default all: {','.join(VIEWS)})")
    args = ap.parse_args(argv)
    views = tuple(v.strip() for v in args.views.split(",") if v.strip())
    unknown = [v for v in views if v not in VIEWS]
    if unknown or not views:
        print(f"lab_screenshots: --views takes names from {', '.join(VIEWS)}; got {args.views!r}.", file=sys.stderr)
        return 2

    from andrea.errors import AndreaError
    from andrea.inside.embed import load_subject
    from andrea.web.lab import LabServer

    found = find_browser()
    if isinstance(found, str):
        print(f"lab_screenshots: {found}.", file=sys.stderr)
        return 2
    try:
        subject = load_subject(args.checkpoint)
    except (AndreaError, FileNotFoundError) as e:
        print(f"lab_screenshots: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = LabServer(subject, "127.0.0.1", 0)
    url = server.start()
    driver = open_browser(args.width, args.height)
    try:
        states = show_each_view(driver, url, out, views=views)
        errors = console_errors(driver)
    finally:
        driver.quit()
        server.stop()
    for view in views:
        print(f"{view:<10} {states.get(view)}  {out / (view + '.png')}")
    bad = [v for v, s in states.items() if s != "ready"]
    if errors or bad:
        for e in errors:
            print(f"console error: {e}", file=sys.stderr)
        if bad:
            print(f"views that did not load: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
