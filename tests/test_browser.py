"""The built site in a real browser, and its links checked offline.

The browser tests build the site with ``mkdocs build --strict`` into a temporary folder,
serve it on 127.0.0.1 with Python's ``http.server``, and drive Debian's headless Chromium
through chromedriver (Selenium). They check what a reader meets: generated tables on the key
pages, every artifact link resolving, Material's search finding a figure, and no page asking
for anything off the host. Without chromium, chromedriver or selenium they skip and say
which is missing (``make test`` installs the Debian packages when it runs as root).

The link check needs no browser: mkdocs-htmlproofer-plugin runs last in ``mkdocs.yml`` with
external URLs off, and a small site with a broken anchor must fail to build.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
CHROME_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
    "--disable-dev-shm-usage", "--disable-extensions", "--disable-default-apps",
    "--disable-domain-reliability", "--disable-client-side-phishing-detection", "--window-size=1280,1000",
    # Every host but the loopback is unresolvable: a stray request fails here and shows in the log.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)
LOCAL_SCHEMES = ("data", "blob", "about", "chrome", "chrome-extension", "devtools")  # never leave the host


def _which(names: tuple[str, ...], fallback: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return fallback if Path(fallback).is_file() else None


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    missing = []
    if _which(BROWSERS, "/usr/bin/chromium") is None:
        missing.append("chromium (Debian package chromium)")
    if _which(("chromedriver",), "/usr/bin/chromedriver") is None:
        missing.append("chromedriver (Debian package chromium-driver)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (the test extra)")
    if missing:
        return "needs " + ", ".join(missing) + "; `make test` installs them when run as root with apt-get"
    return None


def build_site(dest: Path) -> Path:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(dest)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-4000:]}"
    return dest


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The strict build, served on a free port of 127.0.0.1; yields (base URL, site folder)."""
    reason = browser_missing()
    if reason:
        pytest.skip(reason)
    site = build_site(tmp_path_factory.mktemp("built") / "site")
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", site
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser(served, tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _which(BROWSERS, "/usr/bin/chromium")
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    service = Service(executable_path=_which(("chromedriver",), "/usr/bin/chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def requests_seen(driver) -> list[str]:
    """URLs the page asked for since the last call (Chrome DevTools Network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def off_host(urls: list[str], base: str) -> list[str]:
    host = urlsplit(base).netloc
    return [u for u in urls if urlsplit(u).scheme not in LOCAL_SCHEMES and urlsplit(u).netloc != host]


def visit(driver, url: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, 30).until(EC.presence_of_element_located((By.CSS_SELECTOR, "article.md-content__inner")))
    return driver


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def table_texts(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    return [t.text for t in driver.find_elements(By.CSS_SELECTOR, "article table")]


# --- what a reader sees -----------------------------------------------------------------------------

@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "must_show"),
    [
        ("edge/device-simulation/", ["Jetson AGX Orin 64 GB", "204.8"]),
        ("edge/cpu-path/", ["code predictor loop (15 passes)", "97.1"]),
        ("analysis/claims-audit/", ["s4", "cannot be checked"]),
        ("artifacts/cpu-path/sampler-t2/", ["median (ms)"]),
    ],
)
def test_key_pages_render_their_generated_tables(browser, served, page, must_show):
    from selenium.webdriver.common.by import By

    base, _site = served
    visit(browser, base + page)
    tables = table_texts(browser)
    assert tables, f"{page}: no table rendered"
    shown = "\n".join(tables)
    for text in must_show:
        if text == "s4":
            text = "§4"
        assert text in shown, f"{page}: {text!r} not in any table"
    article = browser.find_element(By.CSS_SELECTOR, "article").text
    assert "<!-- table:" not in article and "<!-- value:" not in article
    if page.startswith("artifacts/"):
        assert "Check this yourself" in article and "vllm-omni-bench compare" in article
    else:  # each generated table is captioned with a link to its artifact page
        links = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "article a[href*='/artifacts/']")]
        assert links and all(status(link) == 200 for link in set(links))


@pytest.mark.browser
@pytest.mark.slow
def test_every_artifact_page_and_raw_file_resolves(browser, served):
    from selenium.webdriver.common.by import By

    base, site = served
    visit(browser, base + "artifacts/")
    links = {a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "article table a[href]")}
    published = site / "results"  # the copy of results/ this build was made from
    expected = {p.relative_to(published).with_suffix("").as_posix() for p in published.rglob("*.json")}
    assert len(expected) >= 30
    assert len(links) == len(expected), "the artifacts index should link every file under results/"
    for art_id in sorted(expected):
        page = urljoin(base, f"artifacts/{art_id}/")
        assert page in links, f"no link to {art_id} on the artifacts index"
        assert status(page) == 200, page
        with urllib.request.urlopen(urljoin(base, f"results/{art_id}.json"), timeout=30) as resp:
            assert json.load(resp)["id"] == art_id


def search_hits(driver, base: str, query: str, wanted: str) -> list[str]:
    """The result links Material's search shows for ``query``, once one contains ``wanted`` (or after 30 s)."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    visit(driver, base)
    shown = lambda d, css: next((e for e in d.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()), None)  # noqa: E731
    if shown(driver, "input.md-search__input") is None:  # narrow layouts hide the box behind an icon
        shown(driver, "label[for='__search']").click()
    box = WebDriverWait(driver, 30).until(lambda d: shown(d, "input.md-search__input"))
    box.click()
    box.send_keys(query)
    box.send_keys(Keys.SPACE)  # Material searches as one types; a key event after the query triggers it

    seen: list[str] = []

    def hits(d):  # the result list re-renders while the query settles: wait for the page sought
        seen[:] = [a.get_attribute("href") for a in d.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")]
        return any(wanted in h for h in seen)

    try:
        WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,)).until(hits)
    except TimeoutException:
        pass
    return seen


@pytest.mark.browser
@pytest.mark.slow
def test_search_finds_a_figures_page(browser, served):
    base, _site = served
    # the Orin AGX bandwidth, a figure in the device-simulation tables
    seen = search_hits(browser, base, "204.8", "device-simulation")
    assert any("device-simulation" in h for h in seen), f"no device-simulation page among the search results: {seen}"


# --- a reader's first minute: every study page answers on its first screen -------------------------

STUDY_PAGES = sorted(p.relative_to(ROOT / "docs").with_suffix("").as_posix()
                     for folder in ("edge", "engines") for p in (ROOT / "docs" / folder).glob("*.md"))
SCREEN = (1280, 800)
FIGURE_MIN_PX = 100  # at least this much of the headline table or chart shows above the screen's bottom


def _title(page: str) -> str:
    text = (ROOT / "docs" / f"{page}.md").read_text(encoding="utf-8")
    if text.startswith("---\n"):  # front matter (the search boost) first
        text = text.split("\n---\n", 1)[1]
    first = text.lstrip("\n").splitlines()[0]
    assert first.startswith("# "), f"docs/{page}.md: the first line after the front matter is not its title"
    return first[2:].strip()


@pytest.mark.browser
@pytest.mark.slow
def test_each_study_page_answers_on_its_first_screen(browser, served):
    """On a 1280x800 screen, before any scrolling: the page's title, a summary, and a table or a chart."""
    from selenium.webdriver.common.by import By

    assert len(STUDY_PAGES) >= 12
    base, _site = served
    width, height = SCREEN
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    rect = "const r = arguments[0].getBoundingClientRect(); return [r.top, r.bottom];"
    misses = {}
    try:
        for page in STUDY_PAGES:
            visit(browser, base + page + "/")
            browser.execute_script("window.scrollTo(0, 0)")
            h1 = browser.find_element(By.CSS_SELECTOR, "article h1")
            summary = next((p for p in browser.find_elements(By.CSS_SELECTOR, "article > p")
                            if len(p.text) >= 120), None)
            figures = browser.find_elements(By.CSS_SELECTOR, "article table, article svg")
            tops = [browser.execute_script(rect, f)[0] for f in figures]
            problems = []
            if browser.execute_script(rect, h1)[1] > height:
                problems.append("title below the screen")
            if summary is None or browser.execute_script(rect, summary)[0] > height - 40:
                problems.append("no summary paragraph on the first screen")
            if not tops or min(tops) > height - FIGURE_MIN_PX:
                problems.append(f"first table or chart at {min(tops, default=None)} px")
            if problems:
                misses[page] = problems
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert not misses, f"pages whose first screen does not answer: {misses}"


@pytest.mark.browser
@pytest.mark.slow
def test_search_finds_each_study_page_by_its_title(browser, served):
    base, _site = served
    missed = {}
    for page in STUDY_PAGES:
        seen = search_hits(browser, base, _title(page), page + "/")
        if not any(page + "/" in h for h in seen[:10]):
            missed[page] = seen[:10]
    assert not missed, f"pages the search does not find by their title among the first ten results: {missed}"


RESOURCE = re.compile(r"<(?:script|img|iframe|audio|video|source|embed|object|image|use)\b[^>]*?"
                      r"\b(?:src|data|srcset|xlink:href)=[\"']([^\"']+)[\"']", re.I)
LINK = re.compile(r"<link\b[^>]*>", re.I)
LOADED_RELS = {"stylesheet", "icon", "preload", "modulepreload", "prefetch", "manifest", "apple-touch-icon"}
CSS_URL = re.compile(r"url\(\s*[\"']?([^\"')]+)", re.I)


def page_resources(html: str, page_url: str) -> frozenset[str]:
    """What a page's HTML makes the browser load (scripts, styles, images, frames, media), as absolute URLs;
    <link>s only where their rel loads something (not prev, next or canonical)."""
    found = RESOURCE.findall(html) + CSS_URL.findall(html)
    for tag in LINK.findall(html):
        rel = re.search(r"\brel=[\"']([^\"']+)", tag)
        href = re.search(r"\bhref=[\"']([^\"']+)", tag)
        if rel and href and LOADED_RELS & set(rel.group(1).lower().split()):
            found.append(href.group(1))
    return frozenset(urljoin(page_url, u.split()[0]) for u in found if u.strip() and not u.startswith(("#", "data:")))


@pytest.mark.browser
@pytest.mark.slow
def test_no_page_requests_anything_off_the_host(browser, served):
    """Every page's HTML is read for what it loads; the browser then opens one page of each set of
    resources (pages that load the same files ask for the same things) and of each part of the site,
    and logs every request they make."""
    base, site = served
    pages = sorted(p.parent.relative_to(site).as_posix() for p in site.rglob("index.html"))
    assert len(pages) > 20
    kinds: dict[frozenset[str], str] = {}
    sections: dict[str, str] = {}  # and the first page of each part of the site (home, edge, engines, ...)
    static: dict[str, list[str]] = {}
    for page in pages:
        url = base if page == "." else urljoin(base, page + "/")
        loads = page_resources((site / page / "index.html").read_text(encoding="utf-8"), url)
        assert any(u.endswith(".js") for u in loads), f"{page}: no script found in its HTML"
        if off_host(sorted(loads), base):
            static[page] = off_host(sorted(loads), base)
        kinds.setdefault(loads, url)
        sections.setdefault("/".join(page.split("/")[:2]), url)
    assert not static, f"pages whose HTML loads off-host URLs: {static}"
    requests_seen(browser)  # drop what earlier tests left in the log
    offenders: dict[str, list[str]] = {}
    for url in sorted(set(kinds.values()) | set(sections.values())):
        visit(browser, url)
        time.sleep(0.05)
        bad = off_host(requests_seen(browser), base)
        if bad:
            offenders[url] = bad
    assert not offenders, f"pages asked for off-host URLs: {offenders}"


def test_off_host_filter():
    base = "http://127.0.0.1:8123/"
    assert off_host([base + "x.js", "data:image/png;base64,AA", "about:blank"], base) == []
    assert off_host(["https://fonts.googleapis.com/css", "http://127.0.0.1:9999/"], base) == [
        "https://fonts.googleapis.com/css", "http://127.0.0.1:9999/"]


# --- links in the built HTML, offline -----------------------------------------------------------------

def test_htmlproofer_is_the_last_plugin_and_stays_offline():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # !ENV and python tags
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    last = config["plugins"][-1]
    assert isinstance(last, dict) and "htmlproofer" in last
    assert last["htmlproofer"]["validate_external_urls"] is False
    assert last["htmlproofer"].get("raise_error") or last["htmlproofer"].get("raise_error_after_finish")


def test_a_broken_link_fails_the_build(tmp_path):
    pytest.importorskip("htmlproofer")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n## Figures\n\nSee [the figures](other.md#no-such-heading).\n")
    (docs / "other.md").write_text("# Other\n\n## Figures\n")
    (tmp_path / "mkdocs.yml").write_text(
        "site_name: t\nplugins:\n  - htmlproofer:\n      validate_external_urls: false\n"
        "      raise_error_after_finish: true\nvalidation:\n  anchors: info\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(tmp_path / "mkdocs.yml")],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert proc.returncode != 0
    assert "other.md#no-such-heading" in proc.stderr or "no-such-heading" in proc.stderr
