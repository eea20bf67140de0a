"""The search page and the offline API docs in a real browser (Debian's chromium + chromedriver,
driven by Selenium) against a real `kbpg serve` over the demo knowledge base (samples/kb)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import REPO_ROOT, TEMPLATE_DB, create_database, drop_database
from tests.helpers import run_kbpg
from tests.http_server import running_server
from tests.search_kb import env_for

TOKEN = "page-test-token"
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def demo_api(
    admin_url: str, template_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """`kbpg serve` (token required) over samples/kb ingested by the real `kbpg ingest`."""
    name = f"kbpg_page_{uuid.uuid4().hex[:10]}"
    url = create_database(admin_url, name, TEMPLATE_DB)
    home = tmp_path_factory.mktemp("kbpg-page")
    try:
        env = env_for(url, home, KBPG_API_TOKEN=TOKEN)
        samples = REPO_ROOT / "samples" / "kb"
        ingest = run_kbpg("ingest", str(samples), "--recursive", env=env)
        assert ingest.returncode == 0, ingest.stderr
        with running_server(env, home / "serve.log", "--source-root", str(samples)) as api:
            yield api
    finally:
        drop_database(admin_url, name)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1280,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: WebDriver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def first_document(driver: WebDriver) -> str:
    hits = driver.find_elements(By.CSS_SELECTOR, "#hits .hit .doc")
    return hits[0].text if hits else ""


def wait_for(driver: WebDriver, condition: Any, timeout: float = 60) -> Any:
    # the page replaces its result list when an answer arrives: an element read by the
    # condition may go stale in between, and the condition is then asked again
    return WebDriverWait(
        driver, timeout, ignored_exceptions=(StaleElementReferenceException,)
    ).until(condition)


def test_search_page(demo_api: httpx.Client, browser: WebDriver) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    browser.get(f"{demo_api.base_url}/")
    query = browser.switch_to.active_element  # the query box has focus on load
    assert query.get_attribute("id") == "query"
    query.send_keys("how do I renew a parking permit", Keys.ENTER)

    # the server wants a token: asked once, then the search runs
    token = wait_for(browser, lambda d: d.find_element(By.ID, "token"))
    wait_for(browser, lambda d: token.is_displayed())
    assert browser.switch_to.active_element == token
    token.send_keys(TOKEN, Keys.ENTER)
    wait_for(browser, lambda d: first_document(d))

    expected = demo_api.post(
        "/api/v1/kb/search", json={"query": "how do I renew a parking permit"}, headers=auth
    ).json()
    assert first_document(browser) == "Renewing a parking permit"
    hits = browser.find_elements(By.CSS_SELECTOR, "#hits .hit")
    assert [h.get_attribute("data-chunk-id") for h in hits] == [
        str(c["chunk_id"]) for c in expected["chunks"]
    ]
    first = hits[0]
    # the server's highlights (kb.highlight: whole words from the lexemes), not the page's own
    marks = [m.text for m in first.find_elements(By.TAG_NAME, "mark")]
    top = expected["chunks"][0]
    assert marks == [top["content"][a:b] for a, b in top["highlights"]]
    # inflected forms of the question's words, whole ("renewal" for "renew")
    assert marks and all(m.lower().startswith(("renew", "park", "permit")) for m in marks), marks
    meta = first.find_element(By.CLASS_NAME, "meta").text
    assert (
        "vector #" in meta and "BM25 #" in meta and "graph \u2013" in meta
    )  # not found by the graph arm
    assert "parking/renew-permit.md" in meta  # relative to --source-root
    context = browser.find_element(By.ID, "context").text
    assert context == expected["context"].strip()
    assert context.startswith("[1] Renewing a parking permit")
    screenshot(browser, "search-page.png")

    # change a filter (keyboard only: Enter in the field submits): the results change
    category = browser.find_element(By.ID, "category")
    category.send_keys("libraries", Keys.ENTER)
    wait_for(browser, lambda d: first_document(d) not in ("", "Renewing a parking permit"))
    filtered = demo_api.post(
        "/api/v1/kb/search",
        json={"query": "how do I renew a parking permit", "category": "libraries"},
        headers=auth,
    ).json()
    assert first_document(browser) == filtered["chunks"][0]["document"]
    sources = browser.find_elements(By.CSS_SELECTOR, "#hits .hit .source")
    assert sources and all(s.text.startswith("libraries/") for s in sources)
    screenshot(browser, "search-page-filtered.png")

    # a metadata filter (JSON, as the API takes it) in place of the category
    category.clear()
    metadata = browser.find_element(By.ID, "filter")
    metadata.send_keys('{"updated": ', Keys.ENTER)
    status = browser.find_element(By.ID, "status")
    wait_for(browser, lambda d: "must be a JSON object" in status.text)
    assert browser.switch_to.active_element == metadata
    since = {"updated": {"$gte": "2025-01-01"}}
    metadata.clear()
    metadata.send_keys(json.dumps(since), Keys.ENTER)
    recent = demo_api.post(
        "/api/v1/kb/search",
        json={"query": "how do I renew a parking permit", "filter": since},
        headers=auth,
    ).json()
    recent_ids = [str(c["chunk_id"]) for c in recent["chunks"]]
    wait_for(
        browser,
        lambda d: (
            [
                h.get_attribute("data-chunk-id")
                for h in d.find_elements(By.CSS_SELECTOR, "#hits .hit")
            ]
            == recent_ids
        ),
    )
    assert recent_ids and {c["source"] for c in recent["chunks"]} <= {
        "parking/renew-permit.md",
        "parking/residential-permits.md",
    }
    metadata.clear()

    # the token stayed in the page's memory: nothing stored
    stored = browser.execute_script(
        "return [localStorage.length, sessionStorage.length, document.cookie]"
    )
    assert stored == [0, 0, ""]

    # phone width: nothing wider than the screen
    browser.set_window_size(390, 844)
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0
    screenshot(browser, "search-page-phone.png")


def test_docs_page_works_offline(demo_api: httpx.Client, browser: WebDriver) -> None:
    browser.get(f"{demo_api.base_url}/docs")
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#operations .op"))
    text = browser.find_element(By.ID, "operations").text
    assert "POST/api/v1/kb/search" in text.replace(" ", "").replace("\n", "")
    assert "Number of chunks to return." in text
    origin = str(demo_api.base_url).rstrip("/")
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert loaded and all(name.startswith(origin) for name in loaded), loaded
    screenshot(browser, "docs-page.png")
