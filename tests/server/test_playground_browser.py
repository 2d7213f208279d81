"""The playground in a real headless browser (Debian's chromium + chromium-driver, selenium):
the page loads with every non-local host unresolvable, a chat streams with the API key typed into
the page, and the dashboard's numbers move. Skipped where chromium, its driver or selenium are
missing.
"""

from __future__ import annotations

import shutil

import pytest
from e2e.server import ServerProcess

from pytgi.demo_model import demo_model_path

webdriver = pytest.importorskip("selenium.webdriver")
CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="chromium/chromedriver missing")

KEY = "browser-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("playground-browser") / "server.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTGI_CPU_KERNELS", "0")  # the page does not need the compiled kernels
        proc = ServerProcess(demo_model_path(), "--api-key", KEY, log_path=log)
    proc.wait_healthy(timeout_s=300)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    # no network but the server: any other host fails to resolve (a CDN asset would not load)
    options.add_argument("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    driver.set_window_size(1200, 900)
    yield driver
    driver.quit()


def _text(browser, element_id: str) -> str:
    return browser.find_element("id", element_id).text


def test_page_loads_chat_streams_and_dashboard_moves(server, browser, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 120, poll_frequency=0.2)
    browser.get(f"{server.url}/playground")
    assert browser.title == "pytgi playground"
    # the scripts ran (bundled assets, nothing fetched from elsewhere): the dashboard fills in
    wait.until(lambda b: " / " in _text(b, "m-kv"))
    assert _text(browser, "m-requests") == "0"

    # without the key the chat is refused and says so
    browser.find_element("id", "prompt").send_keys("Hello")
    browser.find_element("id", "send").click()
    wait.until(lambda b: b.find_elements("css selector", ".msg.error"))
    assert "401" in browser.find_element("css selector", ".msg.error").text

    browser.find_element("id", "api-key").send_keys(KEY)
    browser.find_element("id", "max-tokens").clear()
    browser.find_element("id", "max-tokens").send_keys("24")
    browser.find_element("id", "prompt").send_keys("Tell me a story")
    browser.find_element("id", "send").click()
    wait.until(lambda b: "finish_reason" in _text(b, "chat-status"))
    replies = browser.find_elements("css selector", ".msg.assistant")
    assert replies and replies[-1].text.strip()
    # the dashboard saw the request end
    wait.until(lambda b: _text(b, "m-requests") == "1")
    browser.save_screenshot(str(tmp_path / "playground.png"))
