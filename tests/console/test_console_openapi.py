"""The console's OpenAPI document (``coordinator/console/static/openapi.json``, served at
``/api/v1/openapi.json``) against a live node: every document the API answers for real groups,
topics and errors matches its schema, and schemathesis, generating requests from the document
alone, finds no response outside it (status, content type, schema) and no server error."""
import json
import os
import shutil
import subprocess
import sys
import urllib.request

import pytest

from consumer import Consumer
from coordinator import protocol
from tests.console.test_console_api import Served, get
from tests.support.groups import wait_stable
from tests.support.helpers import fill, wait_for

DOCUMENT = os.path.join(os.path.dirname(protocol.__file__), os.pardir, "console", "static", "openapi.json")


@pytest.fixture
def live(cluster, data_dir, zk, zk_connect):
    """A node's console over two groups with members, committed offsets and lag, and two topics."""
    fill(data_dir, "orders", [20, 10], zk=zk)
    fill(data_dir, "audit", [5], zk=zk)
    node = cluster.node("n1")
    served = Served(node, data_dir)
    consumers = [Consumer(g, ["orders", "audit"], zk=zk_connect, data_dir=data_dir, session_timeout_ms=2000,
                          client_id=g, auto_offset_reset="earliest") for g in ("billing", "audit")]
    try:
        for c in consumers:
            wait_stable(zk, c.group_id, 1)
        wait_for(lambda: all(c.poll(timeout_ms=50) is not None and c.commit() is None for c in consumers)
                 and served.api("/groups/billing/offsets")[0] == 200, 20, message="offsets read by the console")
        yield served
    finally:
        for c in consumers:
            c.close()
        served.close()


def _validator(name: str):
    import jsonschema_rs
    with open(DOCUMENT) as f:
        doc = json.load(f)
    return jsonschema_rs.validator_for({"$ref": f"#/components/schemas/{name}", "components": doc["components"]})


def _response_schema(path: str, status: int) -> str:
    with open(DOCUMENT) as f:
        doc = json.load(f)
    ref = doc["paths"][path]["get"]["responses"][str(status)]["content"]["application/json"]["schema"]["$ref"]
    return ref.rsplit("/", 1)[1]


def test_the_console_serves_its_openapi_document(live):
    with urllib.request.urlopen(live.url + "/api/v1/openapi.json", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("application/json")
        served = json.loads(r.read())
    with open(DOCUMENT) as f:
        assert served == json.load(f)
    endpoints = live.api("/")[1]["endpoints"]
    assert "/api/v1/openapi.json" in endpoints
    # Every endpoint the API lists is documented (the document itself aside).
    assert {e[len("/api/v1"):] for e in endpoints} - {"/openapi.json"} == set(served["paths"]) - {"/"}


def test_every_answer_for_real_groups_and_errors_matches_the_document(live, zk):
    pytest.importorskip("jsonschema_rs")
    zk.ensure_path(protocol.state_path("broken"))
    zk.set(protocol.state_path("broken"), b"not json")
    wait_for(lambda: live.api("/groups/broken")[0] == 500, 10, message="the console sees the broken group")
    asked = [("/", "/", 200), ("/coordinator", "/coordinator", 200), ("/groups", "/groups", 200),
             ("/groups?state=Stable&sort=lag&limit=1", "/groups", 200), ("/topics", "/topics", 200),
             ("/topics/orders", "/topics/{topic}", 200), ("/topics/nope", "/topics/{topic}", 404),
             ("/groups/nope", "/groups/{group}", 404), ("/groups/broken", "/groups/{group}", 500)]
    for g in ("billing", "audit"):
        asked += [(f"/groups/{g}{tail}", "/groups/{group}" + tail, 200)
                  for tail in ("", "/members", "/offsets", "/timeline")]
    for url, path, status in asked:
        got_status, document = live.api(url)
        assert got_status == status, (url, document)
        errors = [e.message for e in _validator(_response_schema(path, status)).iter_errors(document)]
        assert not errors, (url, document, errors)


def test_schemathesis_finds_no_answer_outside_the_document(live, tmp_path):
    st = shutil.which("schemathesis", path=os.path.dirname(sys.executable))
    if st is None:
        pytest.skip("schemathesis is not installed (bin/setup installs it)")
    # Methods other than GET are left out: the HTTP server answers them 501 (http.server's
    # default), which is no answer of the API's.
    config = tmp_path / "schemathesis.toml"
    config.write_text("[phases.coverage]\nunexpected-methods = []\n")
    proc = subprocess.run(
        [st, "--config-file", str(config), "run", live.url + "/api/v1/openapi.json", "--url", live.url + "/api/v1", "--no-color",
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
         "--max-examples", "10", "--seed", "1", "--workers", "1", "--phases", "examples,coverage,fuzzing",
         "--generation-database", "none", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
