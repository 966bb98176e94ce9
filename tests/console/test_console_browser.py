"""The console in a real browser (headless Chromium from Debian, driven by Selenium), against a
live system: 2 ``coordinatord`` processes, 2 groups of ``groupctl consume`` processes, members
joining and leaving, a SIGKILLed consumer, a topic growing, and the node leading the group
SIGKILLed. The pages show the owners and lag the API (and so groupctl) shows, the timeline gains
each rebalance with its reason and moved count and keeps it through the failover, live refresh
updates the page without a reload, and hostile names stay text.

One live system per module (a handful of tests share it). Screenshots of every page are written
to the directory printed at the end (``ZKGROUPS_SCREENSHOTS`` chooses it)."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest

from coordinator import protocol, read
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from tests.support.browser import BrowserUnavailable, open_browser
from tests.support.helpers import GROUPCTL, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONSOLE_LINE = re.compile(r"console at (http://\S+)/ui/")
XSS_CLIENT = "<script>document.title='pwned-client'</script>"
XSS_GROUP = '"><img src=x onerror="document.title=\'pwned-group\'">'
SESSION_MS = 2000
pytestmark = pytest.mark.process


class LiveSystem:
    """ZooKeeper (the session's), two coordinatord processes serving the console, consumers as
    ``groupctl consume`` processes, records appended by a thread."""

    def __init__(self, connect: str, workdir: str):
        self.connect, self.workdir = connect, workdir
        self.data_dir = os.path.join(workdir, "data")
        os.makedirs(self.data_dir)
        self.env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
        self.procs = {}
        self.zk = start_client(connect, 4000)
        self.urls = {}
        self.producing = threading.Event()
        self.producer = None

    def coordinator(self, name: str) -> None:
        log = open(os.path.join(self.workdir, f"{name}.log"), "w")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "consumer.cli.coordinatord", "--zk", self.connect, "--node-id", name,
             "--session-timeout-ms", str(SESSION_MS), "--rebalance-timeout-ms", "3000", "--http-addr", "127.0.0.1:0",
             "--data-dir", self.data_dir, "--lag-interval", "0.5"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=log)

    def console_url(self, name: str) -> str:
        path = os.path.join(self.workdir, f"{name}.log")

        def found():
            with open(path) as f:
                return next((m.group(1) for m in map(CONSOLE_LINE.search, f) if m), None)
        self.urls[name] = wait_for(found, 30, message=f"{name}'s console")
        return self.urls[name]

    def consumer(self, name: str, group: str, topic: str, client_id: str = "zkgroups") -> str:
        config = os.path.join(self.workdir, f"{name}.toml")
        with open(config, "w") as f:
            f.write(f"client_id = {json.dumps(client_id)}\nauto_offset_reset = \"earliest\"\nmax_poll_records = 20\n")
        consumer_id = f"{group}_{name}"
        self.procs[name] = subprocess.Popen(
            GROUPCTL + ["--zk", self.connect, "--data-dir", self.data_dir, "consume", group, topic, "--config", config,
                        "--consumer-id", consumer_id, "--session-timeout-ms", str(SESSION_MS)],
            env=self.env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.workdir, f"{name}.log"), "w"))
        wait_for(lambda: consumer_id in read.children(self.zk, protocol.ids_path(group)), 30,
                 message=f"{name} registered")
        return consumer_id

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)

    def stop(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGTERM)
        self.procs[name].wait(30)

    def produce(self, topic: str, per_second: int = 40) -> None:
        """Append records to every partition of ``topic`` (as the topic grows, to the new ones too)."""
        from consumer.log import Log

        def run():
            with Log(self.data_dir) as log:
                i = 0
                while not self.producing.is_set():
                    partitions = TopicRegistry(self.zk).partitions(topic)
                    for p in range(partitions):
                        log.append(topic, p, [(None, f"r{i}".encode(), int(time.time() * 1000), ())])
                    i += 1
                    self.producing.wait(1.0 / per_second)
        self.producer = threading.Thread(target=run, daemon=True)
        self.producer.start()

    def close(self) -> None:
        self.producing.set()
        if self.producer:
            self.producer.join(5)
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)
        close_client(self.zk)


def api(base: str, path: str):
    with urllib.request.urlopen(base + "/api/v1" + path, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def shots(tmp_path_factory, request):
    path = os.environ.get("ZKGROUPS_SCREENSHOTS") or str(tmp_path_factory.mktemp("console-screenshots"))
    os.makedirs(path, exist_ok=True)
    yield path
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and reporter is not None:
        with capture.global_and_fixture_disabled():  # shown whatever -s says
            reporter.write_line(f"console screenshots: {path}")


@pytest.fixture(scope="module")
def browser():
    try:
        b = open_browser()
    except BrowserUnavailable as e:
        pytest.skip(f"no browser for the console tests: {e}")
    yield b.driver
    b.close()


@pytest.fixture(scope="module")
def live(zk_server, tmp_path_factory):
    system = LiveSystem(f"{zk_server.connect}/console-{uuid.uuid4().hex[:6]}", str(tmp_path_factory.mktemp("live")))
    try:
        TopicRegistry(system.zk).create("orders", 4)
        TopicRegistry(system.zk).create("audit", 2)
        system.produce("orders")
        for name in ("n1", "n2"):
            system.coordinator(name)
        for name in ("n1", "n2"):
            system.console_url(name)
        system.consumer("pay-1", "payments", "orders", XSS_CLIENT)
        system.consumer("aud-1", "audit", "audit")
        hostile = protocol.group_path(XSS_GROUP)  # an invalid name the coordinators ignore; the console lists it
        system.zk.ensure_path(hostile)
        system.zk.create(protocol.state_path(XSS_GROUP), protocol.GroupState(3, protocol.FAILED, error=XSS_GROUP).encode())
        wait_for(lambda: read.group_state(system.zk, "payments").state == protocol.STABLE, 30, message="payments stable")
        yield system
    finally:
        system.close()


def shoot(driver, shots, name):
    """A screenshot of the whole page (the window grown to its height, up to 2,400 pixels)."""
    height = min(2400, max(800, driver.execute_script("return document.documentElement.scrollHeight")))
    driver.set_window_size(1440, height)
    try:
        driver.save_screenshot(os.path.join(shots, f"{name}.png"))
    finally:
        driver.set_window_size(1440, 1000)


def page(driver, url, shots=None, name=None, wait_text=None):
    driver.get(url)
    if wait_text:
        wait_for(lambda: wait_text in driver.find_element("tag name", "body").text, 15, message=f"{wait_text!r} on {url}")
    if shots:
        shoot(driver, shots, name)
    return driver.find_element("tag name", "body").text


def no_injection(driver):
    assert driver.title.endswith("zkgroups console")  # a payload that ran would have replaced it
    assert not driver.find_elements("css selector", "img[src='x']")
    assert not [s for s in driver.find_elements("tag name", "script") if "pwned" in (s.get_attribute("innerHTML") or "")]
    violations = [e for e in driver.get_log("browser") if "Content Security Policy" in e.get("message", "")]
    assert not violations, violations


def test_overview_and_groups_pages(live, browser, shots):
    base = live.urls["n1"]
    text = page(browser, base + "/ui/", shots, "overview", wait_text="n2")
    assert "n1" in text and "controller" in text
    leader = read.leader(live.zk).node_id
    assert leader in text
    text = page(browser, base + "/ui/groups", shots, "groups", wait_text="payments")
    assert "audit" in text and XSS_GROUP in text  # the hostile name is shown as text
    no_injection(browser)
    text = page(browser, base + "/ui/groups?state=Failed", shots, "groups-failed", wait_text="Failed")
    assert XSS_GROUP in text and "payments" not in text
    page(browser, base + "/ui/groups/" + urllib.request.quote(XSS_GROUP, safe=""), shots, "group-hostile",
         wait_text="Failed")
    assert browser.find_element("css selector", "h1.name").text == XSS_GROUP
    no_injection(browser)


def test_group_page_shows_owners_lag_and_the_timeline(live, browser, shots):
    base = live.urls["n1"]
    live.consumer("pay-2", "payments", "orders")
    wait_for(lambda: len(read.group_state(live.zk, "payments").members) == 2
             and read.group_state(live.zk, "payments").state == protocol.STABLE, 30, message="two members")
    wait_for(lambda: all(r["current_offset"] is not None for r in api(base, "/groups/payments/offsets")["offsets"]),
             30, message="every partition committed")
    state = read.group_state(live.zk, "payments")
    assigned = {(t, p): protocol.consumer_of_stream(s) for t, parts in state.assignment.items() for p, s in parts.items()}

    def shown():
        """The page's partition rows, once they and the API's show the group's assignment."""
        page(browser, base + "/ui/groups/payments", wait_text="Rebalance timeline")
        rows = [[c.text for c in row.find_elements("tag name", "td")]
                for row in browser.find_elements("css selector", "#live-partitions tbody tr")]
        offsets = api(base, "/groups/payments/offsets")["offsets"]
        api_rows = {(r["topic"], r["partition"]): r for r in offsets}
        on_page = {(cells[0], int(cells[1])): cells[2] for cells in rows}
        if on_page != assigned or {k: r["consumer_id"] for k, r in api_rows.items()} != assigned:
            return None
        return rows, api_rows
    rows, api_rows = wait_for(shown, 30, message="the page showing the assignment")
    shoot(browser, shots, "group")
    for cells in rows:
        row = api_rows[(cells[0], int(cells[1]))]
        assert cells[2] == row["consumer_id"] and cells[6] != "-"  # the owner, and a lag read from the data plane
    members = browser.find_element("id", "live-members").text
    assert XSS_CLIENT in members  # the hostile client id is text
    # The timeline entry is written after the state says Stable: wait for it (the page refreshes itself).
    wait_for(lambda: "payments_pay-2" in browser.find_element("id", "live-timeline").text, 30,
             message="pay-2's join on the page")
    assert "join" in browser.find_element("id", "live-timeline").text
    no_injection(browser)
    page(browser, base + "/ui/topics/orders", shots, "topic", wait_text="payments")


def test_live_refresh_follows_leave_kill_growth_and_failover(live, browser, shots):
    """The page is loaded once: every change below reaches it through the live refresh."""
    leading = wait_for(lambda: read.group_coordinator(live.zk, "payments"), 20, message="payments' coordinator")
    survivor = "n2" if leading == "n1" else "n1"
    page(browser, live.urls[survivor] + "/ui/groups/payments", wait_text="Rebalance timeline")
    browser.execute_script("window.zkgroupsNoReload = 1")

    def timeline_rows():
        return [r.text for r in browser.find_elements("css selector", "#live-timeline tbody tr")]

    def gains(reason, after):
        seen = {}

        def newest():
            rows = seen["rows"] = timeline_rows()
            return rows if len(rows) > after and reason in rows[0] else None
        try:
            return wait_for(newest, 30, message=f"a {reason!r} entry on the page")
        except AssertionError:
            shoot(browser, shots, f"failed-{reason.replace(' ', '-')}")
            with open(os.path.join(shots, f"failed-{reason.replace(' ', '-')}.html"), "w") as f:
                f.write(browser.page_source)
            stamps = browser.find_elements("id", "refresh-stamp")
            stamp = stamps[0].text if stamps else "no stamp"
            raise AssertionError(f"no {reason!r} entry on the page: {seen.get('rows', [])[:3]} ({stamp})") from None

    before = len(timeline_rows())
    live.consumer("pay-3", "payments", "orders")
    rows = gains("join", before)
    live.stop("pay-3")  # a clean leave
    rows = gains("leave", len(rows))
    live.kill("pay-2")  # its session expires: its partitions move
    rows = gains("leave", len(rows))
    assert "payments_pay-2" in rows[0]
    moved = api(live.urls[survivor], "/groups/payments/timeline")["timeline"][-1]["moved"]
    assert moved == 2 and re.search(r"\b2\b", rows[0])
    TopicRegistry(live.zk).add_partitions("orders", 6)
    rows = gains("topic grew", len(rows))
    history = api(live.urls[survivor], "/groups/payments/timeline")["timeline"]
    live.kill(leading)  # the node leading payments' shard
    wait_for(lambda: read.group_coordinator(live.zk, "payments") == survivor, 30, message=f"{survivor} leads payments")
    live.consumer("pay-4", "payments", "orders")
    rows = gains("join", len(rows))
    after = api(live.urls[survivor], "/groups/payments/timeline")["timeline"]
    assert after[:len(history)] == history  # the predecessor's entries, kept in ZooKeeper
    assert after[-1]["node"] == survivor and history[-1]["node"] == leading
    assert browser.execute_script("return window.zkgroupsNoReload") == 1  # never reloaded
    assert "updated" in browser.find_element("id", "refresh-stamp").text
    shoot(browser, shots, "group-after-failover")
    page(browser, live.urls[survivor] + "/ui/", shots, "overview-after-failover", wait_text=survivor)
    no_injection(browser)
