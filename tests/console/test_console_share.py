"""Share groups in the console and in a node's metrics, against a real ZooKeeper and a real
coordinator node: after a ShareConsumer polled, ``/api/v1/share-groups/G`` is the read view's
document (:func:`coordinator.documents.share_group_document`, log ends from the lag reader) and
the page shows its share-partitions, members and settings; hostile member ids, hosts, client
ids and holders stay text; a lock that ended shows on the node's ``/metrics``."""
import re
import urllib.error
import urllib.request

import markupsafe
import pytest

from coordinator import documents, read
from coordinator.protocol.share import SHARE_GROUPS, ShareMember, SharePartitionState
from tests.console.test_console_api import Served
from tests.console.test_console_openapi import _response_schema, _validator
from tests.share.conftest import configure, drain, make  # noqa: F401 (make: the fixture)
from tests.support.helpers import fill, wait_for

pytestmark = pytest.mark.zk

XSS_MEMBER = "<img src=x onerror=\"document.title='pwned-member'\">"
XSS_HOST = "<script>document.title='pwned-host'</script>"
XSS_CLIENT = "\"><svg onload=\"document.title='pwned-client'\">"


def documented(path: str, status: int, document) -> bool:
    """``document`` is what the OpenAPI document says ``path`` answers with ``status``."""
    pytest.importorskip("jsonschema_rs")
    errors = [e.message for e in _validator(_response_schema(path, status)).iter_errors(document)]
    assert not errors, (path, document, errors)
    return True


def page(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8")


@pytest.fixture
def served(cluster, data_dir):
    """A coordinator node (leading every shard: it decides the share groups' time) and its console."""
    node = cluster.node("n1")
    cluster.leader()
    s = Served(node, data_dir)
    yield s
    s.close()


def test_the_api_and_page_show_a_share_groups_partitions_members_and_settings(served, zk, data_dir, make):
    fill(data_dir, "t", [6, 4], zk=zk)
    configure(zk, share_auto_offset_reset="earliest", share_delivery_count_limit=3)
    c = make(share_acknowledgement_mode="explicit", max_poll_records=3, client_id=XSS_CLIENT)
    got = drain(c, 3)

    def answered():
        status, doc = served.api("/share-groups/q")
        if status != 200 or not doc["members"] or not any(r["acquired"] for r in doc["partitions"]):
            return None
        return doc if all(r["log_end_offset"] is not None for r in doc["partitions"]) else None
    doc = wait_for(answered, 15, message="the console shows the share group with its log ends")
    assert doc == documents.share_group_document(read.share_group(zk, "q"), {("t", 0): 6, ("t", 1): 4})
    (member,) = doc["members"]
    assert (member["member_id"], member["client_id"], member["records_held"]) == (c.member_id, XSS_CLIENT, 3)
    assert sum(r["acquired"] for r in doc["partitions"]) == 3 and doc["settings"]["share.delivery.count.limit"] == 3
    for row in doc["partitions"]:
        assert row["lag"] == row["log_end_offset"] - row["start_offset"]
        assert row["holders"] == ([c.member_id] if row["acquired"] else [])
    status, listed = served.api("/share-groups")
    assert status == 200 and listed == {"share_groups": [documents.share_group_row(read.share_group(zk, "q"))]}
    status, missing = served.api("/share-groups/nope")
    assert status == 404
    assert documented("/share-groups/{group}", 200, doc) and documented("/share-groups", 200, listed)
    assert documented("/share-groups/{group}", 404, missing)

    status, html = page(served.url + "/ui/share-groups/q")
    assert status == 200
    for text in (c.member_id, "share.delivery.count.limit", "share.record.lock.duration.ms", "dead letters pending"):
        assert text in html
    assert XSS_CLIENT not in html and str(markupsafe.escape(XSS_CLIENT)) in html
    status, listing = page(served.url + "/ui/share-groups")
    assert status == 200 and 'href="/ui/share-groups/q"' in listing
    assert page(served.url + "/ui/share-groups/nope")[0] == 404
    assert 'href="/ui/share-groups"' in page(served.url + "/ui/")[1]   # in the navigation

    for r in got:   # accepted: the console follows the window's start
        c.acknowledge(r)
    c.commit_sync()
    done = wait_for(lambda: sum(r["start_offset"] for r in served.api("/share-groups/q")[1]["partitions"]) == 3, 10,
                    message="the console sees the start move")
    assert done


def test_hostile_member_ids_hosts_client_ids_and_holders_stay_text(served, zk):
    """Written straight into ZooKeeper (no tool writes such names): the console shows them as text."""
    base = f"{SHARE_GROUPS}/evil"
    zk.ensure_path(f"{base}/members")
    zk.create(f"{base}/members/{XSS_MEMBER}", ShareMember(["t"], host=XSS_HOST, client_id=XSS_CLIENT).encode())
    state = SharePartitionState(start=0, end=2, ranges=[[0, 1, "aq", 1, 1, 0]], held={1: [XSS_MEMBER, 0]},
                                next_token=2)
    zk.ensure_path(f"{base}/partitions/t")
    zk.create(f"{base}/partitions/t/0", state.encode())
    zk.ensure_path(f"{base}/partitions/t/1")
    zk.set(f"{base}/partitions/t/1", b"{not json")   # one unreadable share-partition: reported, the rest shown

    doc = wait_for(lambda: (lambda a: a[1] if a[0] == 200 and a[1]["partitions"] and a[1]["problems"] else None)(
        served.api("/share-groups/evil")), 10, message="the console reads the hostile share group")
    assert [(m["member_id"], m["host"], m["client_id"]) for m in doc["members"]] == [(XSS_MEMBER, XSS_HOST, XSS_CLIENT)]
    assert doc["partitions"][0]["holders"] == [XSS_MEMBER] and list(doc["problems"]) == [f"{base}/partitions/t/1"]
    assert documented("/share-groups/{group}", 200, doc)
    status, html = page(served.url + "/ui/share-groups/evil")
    assert status == 200
    for hostile in (XSS_MEMBER, XSS_HOST, XSS_CLIENT):
        assert hostile not in html and str(markupsafe.escape(hostile)) in html
    main = html[html.index("<main>"):html.index("</main>")]
    assert not re.search(r"<(script|img|svg)\b", main)   # no markup came from ZooKeeper
    listing = page(served.url + "/ui/share-groups")[1]
    assert "unreadable" in listing and 'href="/ui/share-groups/evil"' in listing


def test_a_lock_that_ended_shows_on_the_nodes_metrics(served, zk, data_dir, make):
    fill(data_dir, "t", [3], zk=zk)
    configure(zk, share_auto_offset_reset="earliest", share_record_lock_duration_ms=1000)
    slow = make(share_acknowledgement_mode="explicit")
    drain(slow, 3)
    expired = re.compile(r'^zkgroups_share_records_total\{event="lock_expired",group="q"\} (\d+\.\d+)$', re.M)
    in_flight = re.compile(r'^zkgroups_share_in_flight_records\{group="q",state="(\w+)"\} (\d+\.\d+)$', re.M)

    def scraped():   # the count and the gauge of the same tick (a scrape may fall between the two)
        text = page(served.url + "/metrics")[1]
        counted = expired.search(text)
        states = {s: float(n) for s, n in in_flight.findall(text)}
        return states if counted and float(counted.group(1)) == 3 and states.get("available") == 3 else None
    states = wait_for(scraped, 15, message="the lock's end counted on the node's /metrics")
    assert not states.get("acquired"), states   # released by the coordinator's clock, to be delivered again
    assert served.api("/share-groups/q")[1]["partitions"][0]["max_deliveries"] == 1
