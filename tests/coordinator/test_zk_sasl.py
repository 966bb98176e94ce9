"""SASL (DIGEST-MD5) as the alternative to client certificates, against a real server that
authenticates its users with SASL: a coordinator and a group's members as SASL identities in
the ACL policy, a wrong password refused in one line at once."""
from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from kazoo.exceptions import NoAuthError

from consumer import Consumer
from coordinator import protocol
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.errors import AuthFailed
from coordinator.testing.zkserver import Ensemble, local_classpath
from coordinator.zkclient import close_client, start_client
from tests.support.groups import FAST
from tests.support.helpers import assert_failed, wait_for

pytestmark = [pytest.mark.zk, pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")]

USERS = {"admin": "a-pw-1", "coordinator": "c-pw-2", "billing": "b-pw-3", "audit": "d-pw-4"}


def test_sasl_identities_in_the_acl_policy(tmp_path, data_dir):
    from consumer.cli.groupctl import main
    with Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk"), sasl=USERS) as ens:
        secret = tmp_path / "admin.sasl"
        secret.write_text("admin:a-pw-1\n")
        as_admin = ["--zk", ens.connect + "/app", "--zk-sasl", f"@{secret}"]
        applied = CliRunner().invoke(main, [*as_admin, "acl", "apply", "--coordinator", "sasl:coordinator",
                                            "--group", "billing=sasl:billing", "--group", "audit=sasl:audit"])
        assert applied.exit_code == 0, applied.output
        assert CliRunner().invoke(main, [*as_admin, "topics", "create", "orders", "--partitions", "2"]).exit_code == 0
        connect = ens.connect + "/app"
        node = Coordinator(connect, "n0", CoordinatorConfig(**FAST, zk_sasl="coordinator:c-pw-2")).start()
        consumer = Consumer("billing", ["orders"], zk=connect, data_dir=data_dir, zk_sasl="billing:b-pw-3",
                            session_timeout_ms=1500, enable_auto_commit=False)
        other = start_client(connect, sasl="audit:d-pw-4")
        try:
            wait_for(lambda: consumer.poll(timeout_ms=100) is not None and len(consumer.assignment()) == 2, 20,
                     message="the member joins as a SASL identity")
            consumer.commit()
            acls = {(a.id.scheme, a.id.id) for a in other.get_acls(protocol.offsets_path("billing"))[0]}
            assert ("sasl", "billing") in acls and ("sasl", "admin") in acls, acls
            with pytest.raises(NoAuthError):
                other.create(protocol.offsets_path("billing") + "/orders/9", b"0", makepath=True)
        finally:
            close_client(other)
            consumer.close()
            node.close()
        started = time.monotonic()
        with pytest.raises(AuthFailed, match="refused SASL identity 'billing': wrong password or unknown user"):
            start_client(connect, sasl="billing:wrong", connect_timeout=20)
        assert time.monotonic() - started < 10  # refused at once, not after the connect timeout
        wrong = CliRunner().invoke(main, ["--zk", connect, "--zk-sasl", "admin:nope", "topics", "list"])
        assert_failed(wrong, "refused SASL identity 'admin'")
        assert "nope" not in wrong.output
