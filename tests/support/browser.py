"""Headless Chromium for the console's browser tests, as the harness provides ZooKeeper.

Debian's ``chromium`` and ``chromium-driver`` (the driver always matches the browser; bin/setup
installs both) driven by Selenium, pointed at ``/usr/bin/chromedriver``: nothing is downloaded
at run time (Selenium Manager is kept offline). Where either is missing,
:func:`open_browser` raises :class:`BrowserUnavailable` with one line saying what to install.
"""
from __future__ import annotations

import os
import shutil
import tempfile

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1440,1000")


class BrowserUnavailable(RuntimeError):
    pass


class Browser:
    """A Chromium under WebDriver with a profile directory of its own; ``close()`` ends both."""

    def __init__(self, driver, profile: str):
        self.driver, self.profile = driver, profile

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)


def open_browser() -> Browser:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            raise BrowserUnavailable(f"no {path}: install Debian's {package} package (bin/setup does) to run the "
                                     "console's browser tests")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise BrowserUnavailable("selenium is not installed (pip install -e '.[test]')") from None
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager never downloads anything
    profile = tempfile.mkdtemp(prefix="zkgroups-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    except Exception as e:
        shutil.rmtree(profile, ignore_errors=True)
        raise BrowserUnavailable(f"Chromium did not start under {CHROMEDRIVER}: {str(e).splitlines()[0]}") from None
    driver.set_page_load_timeout(60)
    return Browser(driver, profile)
