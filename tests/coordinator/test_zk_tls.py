"""TLS to ZooKeeper against a real server that has only a TLS port (Ensemble(tls=True): Netty's
secureClientPort, client certificates required, a throwaway CA): coordinators elect and
rebalance, consumers join, fetch and commit, groupctl reads; every way a TLS setting can be
wrong is one line, at once."""
from __future__ import annotations

import datetime
import os
import shutil
import uuid

import pytest
from click.testing import CliRunner

from consumer import Consumer, Producer
from coordinator import protocol, read
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.errors import InvalidConfig
from coordinator.testing.pki import ThrowawayCa
from coordinator.testing.zkserver import Ensemble, local_classpath
from coordinator.zkclient import close_client, start_client
from coordinator.zktls import TlsFailed, parse_tls
from tests.support.groups import FAST
from tests.support.helpers import assert_failed, committed, wait_for

pytestmark = [pytest.mark.zk,
              pytest.mark.skipif(local_classpath() is None or shutil.which("openssl") is None,
                                 reason="needs a local ZooKeeper install and openssl")]


@pytest.fixture(scope="module")
def tls_zk(tmp_path_factory):
    """One TLS-only server for the module (its plaintext port is never opened)."""
    ensemble = Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path_factory.mktemp("zk-tls")), tls=True)
    with ensemble:
        yield ensemble


@pytest.fixture
def chroot(tls_zk):
    return f"{tls_zk.connect}/t-tls-{uuid.uuid4().hex[:8]}"


def test_coordinators_elect_and_rebalance_and_consumers_commit_over_tls_only(tls_zk, chroot, data_dir):
    coordinators, members = tls_zk.client_tls("coordinator"), tls_zk.client_tls("billing")
    config = CoordinatorConfig(**FAST, zk_tls=coordinators)
    nodes = [Coordinator(chroot, f"n{i}", config).start() for i in range(2)]
    consumers = []
    try:
        with Producer(chroot, data_dir=data_dir, zk_tls=members, auto_create_topics=True,
                      auto_create_partitions=4) as producer:
            for i in range(40):
                producer.send("orders", f"r{i}".encode(), key=str(i).encode())
            producer.flush(10)
        settings = dict(zk=chroot, data_dir=data_dir, zk_tls=members, auto_offset_reset="earliest",
                        session_timeout_ms=1500, enable_auto_commit=False)
        consumers.append(Consumer("billing", ["orders"], **settings))
        seen = wait_for(lambda: _records(consumers[0]), 20, message="records over TLS")
        consumers[0].commit()
        consumers.append(Consumer("billing", ["orders"], **settings))
        wait_for(lambda: [_poll_owned(c) for c in consumers] and all(c.assignment() for c in consumers)
                 and len(consumers[0].assignment() | consumers[1].assignment()) == 4, 20,
                 message="a rebalance over TLS gives both consumers partitions")
        leader = next(n for n in nodes if n.is_leader)
        leader.close()
        survivor = next(n for n in nodes if n is not leader)
        wait_for(lambda: survivor.is_leader and survivor.elected.is_set(), 20, message="the other node elected")
        zk = start_client(chroot, tls=coordinators)
        try:
            assert read.leader(zk).node_id == survivor.node_id
            done = committed(zk, "billing", "orders", 4)
            assert sum(v for v in done.values() if v is not None) >= len(seen) > 0
            assert zk.get_acls(protocol.group_path("billing"))[0]  # written through the TLS session
        finally:
            close_client(zk)
    finally:
        for c in consumers:
            c.close()
        for n in nodes:
            n.close()


def _records(consumer):
    return [r for records in consumer.poll(timeout_ms=200).values() for r in records] or None


def _until_value(consumer, value, message):
    """Poll until a record of ``value`` comes (earlier ones may come again: at-least-once)."""
    wait_for(lambda: any(r.value == value for r in _records(consumer) or ()), 30, message=message)


def _poll_owned(consumer):
    consumer.poll(timeout_ms=100)
    return True


def test_groupctl_reads_and_writes_and_consumes_over_tls(tls_zk, chroot, data_dir):
    admin = tls_zk.client_tls("admin")
    from consumer.cli.groupctl import main
    args = ["--zk", chroot, "--data-dir", data_dir, "--zk-tls-ca", admin["ca"], "--zk-tls-cert", admin["cert"],
            "--zk-tls-key", admin["key"]]
    made = CliRunner().invoke(main, [*args, "topics", "create", "audit", "--partitions", "2"])
    assert made.exit_code == 0, made.output
    env = CliRunner(env={"ZK_TLS_CA": admin["ca"], "ZK_TLS_CERT": admin["cert"], "ZK_TLS_KEY": admin["key"]})
    listed = env.invoke(main, ["--zk", chroot, "topics", "list"])
    assert listed.exit_code == 0 and "audit" in listed.stdout, listed.output
    with Producer(chroot, data_dir=data_dir, zk_tls=admin) as producer:
        for i in range(5):
            producer.send("audit", f"a{i}".encode(), partition=i % 2)
    node = Coordinator(chroot, "n0", CoordinatorConfig(**FAST, zk_tls=tls_zk.client_tls("coordinator"))).start()
    try:
        consumed = CliRunner().invoke(main, [*args, "consume", "auditors", "audit", "--max-records", "5"])
        assert consumed.exit_code == 0 and consumed.stdout.count("a") >= 5, consumed.output
        described = CliRunner().invoke(main, [*args, "groups", "describe", "auditors"])
        assert described.exit_code == 0 and "audit" in described.stdout, described.output
    finally:
        node.close()


def test_share_groups_over_tls_only(tls_zk, chroot, data_dir):
    """A share group on a TLS-only server: configure_share_group through a TLS client, two
    ShareConsumers with zk_tls, a lock the coordinator (itself on TLS) ends, the late
    acknowledgement refused; groupctl share-groups and share-consume with --zk-tls-*."""
    from consumer import ShareConsumer
    from consumer.cli.groupctl import main
    from consumer.share import configure_share_group
    from tests.share.conftest import drain, state
    members, admin = tls_zk.client_tls("queue-workers"), tls_zk.client_tls("queue-admin")
    node = Coordinator(chroot, "n0", CoordinatorConfig(**FAST, zk_tls=tls_zk.client_tls("coordinator"))).start()
    zk = start_client(chroot, tls=admin)
    consumers = []
    try:
        with Producer(chroot, data_dir=data_dir, zk_tls=members, auto_create_topics=True,
                      auto_create_partitions=1) as producer:
            for i in range(3):
                producer.send("t", f"q{i}".encode(), partition=0)
        configure_share_group(zk, "q", {"share.auto.offset.reset": "earliest",
                                        "share.record.lock.duration.ms": "1000"})
        settings = dict(zk=chroot, data_dir=data_dir, zk_tls=members, session_timeout_ms=2000)
        slow = ShareConsumer("q", ["t"], share_acknowledgement_mode="explicit", **settings)
        consumers.append(slow)
        got = drain(slow, 3)
        other = ShareConsumer("q", ["t"], **settings)
        consumers.append(other)
        again = drain(other, 3, timeout=15)  # after the lock's second, on the coordinator's clock
        assert sorted((r.offset, r.delivery_count) for r in again) == [(0, 2), (1, 2), (2, 2)]
        for r in got:
            slow.acknowledge(r)
        assert slow.commit_sync()[("t", 0)].offsets == [0, 1, 2]  # refused: the lock had moved
        other.commit_sync()
        assert state(zk).start == 3
        for c in consumers:
            c.close()
        consumers.clear()
        with Producer(chroot, data_dir=data_dir, zk_tls=members) as producer:
            producer.send("t", b"late", partition=0)
        args = ["--zk", chroot, "--data-dir", data_dir, "--zk-tls-ca", admin["ca"], "--zk-tls-cert", admin["cert"],
                "--zk-tls-key", admin["key"]]
        consumed = CliRunner().invoke(main, [*args, "share-consume", "q", "t", "--max-records", "1",
                                             "--session-timeout-ms", "2000"])
        assert consumed.exit_code == 0 and '"late"' in consumed.stdout, consumed.output
        described = CliRunner().invoke(main, [*args, "share-groups", "describe", "q", "--output", "json"])
        assert described.exit_code == 0 and '"q"' in described.stdout, described.output
        listed = CliRunner().invoke(main, [*args, "share-groups", "list"])
        assert listed.exit_code == 0 and "q" in listed.stdout, listed.output
        plain = CliRunner().invoke(main, ["--zk", chroot, "--zk-timeout", "3", "share-groups", "list"])
        assert plain.exit_code != 0 and "Traceback" not in plain.output, plain.output
    finally:
        for c in consumers:
            c.close()
        close_client(zk)
        node.close()


# ---------------------------------------------------------------- one line for each wrong setting

def _connect_fails(connect, tls, match, kind=TlsFailed):
    with pytest.raises(kind) as raised:
        start_client(connect, tls=tls, connect_timeout=20)
    assert match in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
    return str(raised.value)


def test_a_server_certificate_from_another_ca_is_refused(tls_zk, tmp_path):
    good = tls_zk.client_tls("stranger-ca-test")
    other = ThrowawayCa(str(tmp_path / "other"))
    _connect_fails(tls_zk.connect, {**good, "ca": other.cert}, f"certificate the CA in {other.cert} does not trust")


def test_a_host_name_the_server_certificate_does_not_carry_is_refused(tls_zk):
    port = tls_zk.servers[0].client_port
    _connect_fails(f"localhost:{port}", tls_zk.client_tls("hostname-test"), "not valid for 'localhost'")
    # the explicit opt-out connects (and says so in a warning: tested with the CLI below)
    client = start_client(f"localhost:{port}", tls={**tls_zk.client_tls("opt-out"), "verify_hostname": False})
    close_client(client)


def test_expired_and_not_yet_valid_client_certificates_are_refused_before_connecting(tls_zk):
    now = datetime.datetime.now(datetime.timezone.utc)
    expired = tls_zk.client_tls("expired", not_before=now - datetime.timedelta(days=3),
                                not_after=now - datetime.timedelta(days=1))
    with pytest.raises(InvalidConfig, match=f"client certificate {expired['cert']} expired on"):
        parse_tls(expired)
    future = tls_zk.client_tls("future", not_before=now + datetime.timedelta(days=1))
    with pytest.raises(InvalidConfig, match="is not valid before"):
        parse_tls(future)


def test_a_key_that_does_not_match_its_certificate_and_unusable_files(tls_zk, tmp_path):
    one, two = tls_zk.client_tls("pair-one"), tls_zk.client_tls("pair-two")
    with pytest.raises(InvalidConfig, match=f"key {two['key']} does not match certificate {one['cert']}"):
        parse_tls({**one, "key": two["key"]})
    with pytest.raises(InvalidConfig, match=f"key file {tmp_path}/missing.key does not exist"):
        parse_tls({**one, "key": str(tmp_path / "missing.key")})
    with pytest.raises(InvalidConfig, match=f"key file {tmp_path} is a directory"):
        parse_tls({**one, "key": str(tmp_path)})
    if os.geteuid() != 0:  # root reads every file
        os.chmod(one["key"], 0)
        with pytest.raises(InvalidConfig, match="is not readable"):
            parse_tls(one)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(InvalidConfig, match=f"CA file {junk} holds no PEM certificate"):
        parse_tls({**two, "ca": str(junk)})
    with pytest.raises(InvalidConfig, match="needs both cert and key"):
        parse_tls({"ca": two["ca"], "cert": two["cert"]})


def test_an_encrypted_key_needs_its_password_which_is_never_shown(tls_zk, tmp_path):
    issued = tls_zk.ca.issue("locked", password="s3cret-pass")
    tls = {"ca": tls_zk.ca.cert, "cert": issued.cert, "key": issued.key}
    with pytest.raises(InvalidConfig, match="cannot be decrypted: wrong or missing key password"):
        parse_tls({**tls, "key_password": "wrong"})
    secret = tmp_path / "key.pass"
    secret.write_text("s3cret-pass\n")
    setting = parse_tls({**tls, "key_password": f"@{secret}"})
    assert "s3cret" not in repr(setting) and setting.as_dict()["key_password"] == f"@{secret}"
    close_client(start_client(tls_zk.connect, tls=setting))


def test_the_server_refuses_strangers_and_clients_without_a_certificate(tls_zk, tmp_path):
    other = ThrowawayCa(str(tmp_path / "rogue"))
    rogue = other.issue("rogue")
    _connect_fails(tls_zk.connect, {"ca": tls_zk.ca.cert, "cert": rogue.cert, "key": rogue.key},
                   "refused this client's certificate")
    _connect_fails(tls_zk.connect, {"ca": tls_zk.ca.cert}, "requires a client certificate")


def test_plaintext_against_the_tls_port_and_tls_against_a_plaintext_port(tls_zk, zk_server):
    _connect_fails(tls_zk.connect, None, "speaks TLS only")
    _connect_fails(zk_server.connect.split(",")[0], tls_zk.client_tls("wrong-port"),
                   "does not speak TLS on this port")


def test_the_tools_say_it_in_one_line(tls_zk, tmp_path):
    from consumer.cli.groupctl import main
    other = ThrowawayCa(str(tmp_path / "other"))
    good = tls_zk.client_tls("cli")
    untrusted = CliRunner().invoke(main, ["--zk", tls_zk.connect, "--zk-tls-ca", other.cert, "--zk-tls-cert",
                                          good["cert"], "--zk-tls-key", good["key"], "topics", "list"])
    assert_failed(untrusted, "does not trust")
    plain = CliRunner().invoke(main, ["--zk", tls_zk.connect, "topics", "list"])
    assert_failed(plain, "speaks TLS only")
    from coordinator.cli.coordinatord import main as coordinatord
    mismatched = CliRunner().invoke(coordinatord, ["--zk", tls_zk.connect, "--zk-tls-ca", good["ca"],
                                                   "--zk-tls-cert", good["cert"], "--zk-tls-key", other.cert])
    assert mismatched.exit_code == 1 and "Traceback" not in mismatched.output
    assert mismatched.output.strip().splitlines()[-1].startswith("error: "), mismatched.output


# ---------------------------------------------------------------- certificate identities in the ACL policy

def test_certificate_identities_in_the_acl_policy(tls_zk, chroot, data_dir):
    from kazoo.exceptions import NoAuthError
    from consumer.cli.groupctl import main
    from coordinator.errors import AuthFailed
    admin, coordinators = tls_zk.client_tls("admin"), tls_zk.client_tls("coordinator")
    billing, audit = tls_zk.client_tls("billing"), tls_zk.client_tls("audit")
    as_admin = ["--zk", chroot, "--zk-tls-ca", admin["ca"], "--zk-tls-cert", admin["cert"], "--zk-tls-key", admin["key"]]
    applied = CliRunner().invoke(main, [*as_admin, "acl", "apply", "--coordinator", f"cert:{coordinators['cert']}",
                                        "--group", "billing=x509:CN=billing,O=zkgroups",
                                        "--group", f"audit=cert:{audit['cert']}", "--no-world-read"])
    assert applied.exit_code == 0, applied.output
    assert CliRunner().invoke(main, [*as_admin, "topics", "create", "orders", "--partitions", "2"]).exit_code == 0
    node = Coordinator(chroot, "n0", CoordinatorConfig(**FAST, zk_tls=coordinators)).start()
    consumer = Consumer("billing", ["orders"], zk=chroot, data_dir=data_dir, zk_tls=billing, session_timeout_ms=1500,
                        enable_auto_commit=False)
    other = start_client(chroot, tls=audit)
    try:
        wait_for(lambda: consumer.poll(timeout_ms=100) is not None and len(consumer.assignment()) == 2, 20,
                 message="the member joins under certificate ACLs")
        consumer.commit()
        acls = {(a.id.scheme, a.id.id) for a in other.get_acls(protocol.offsets_path("billing"))[0]}
        assert ("x509", "CN=billing,O=zkgroups") in acls and ("x509", "CN=admin,O=zkgroups") in acls, acls
        with pytest.raises(NoAuthError):   # another group's identity writes nothing of billing's
            other.create(protocol.offsets_path("billing") + "/orders/9", b"0", makepath=True)
        with pytest.raises(NoAuthError):   # nor the coordinators'
            other.create(protocol.COORDINATOR + "/forged", b"")
    finally:
        close_client(other)
        consumer.close()
        node.close()
    with pytest.raises(AuthFailed, match="x509 identity 'CN=eve,O=zkgroups' is not in this installation's ACL policy"):
        start_client(chroot, tls=tls_zk.client_tls("eve"))


def test_coordinatord_reads_its_tls_setting_from_zookeeper_tls_in_its_config(tls_zk, chroot, tmp_path, subprocess_env):
    import signal
    import subprocess
    import sys
    coordinators = tls_zk.ca.issue("coordinator-locked", cn="coordinator", password="pw-9f3")
    secret = tmp_path / "key.pass"
    secret.write_text("pw-9f3")
    config = tmp_path / "node.toml"
    config.write_text(f'[coordinator]\nzk = "{chroot}"\nnode_id = "toml-node"\n\n[zookeeper.tls]\n'
                      f'ca = "{tls_zk.ca.cert}"\ncert = "{coordinators.cert}"\nkey = "{coordinators.key}"\n'
                      f'key_password = "@{secret}"\n')
    node = subprocess.Popen([sys.executable, "-m", "coordinator.cli.coordinatord", "--config", str(config)],
                            env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    zk = start_client(chroot, tls=tls_zk.client_tls("reader"))
    try:
        wait_for(lambda: node.poll() is None and read.leader(zk) is not None, 30, message="coordinatord leads over TLS")
        assert read.leader(zk).node_id == "toml-node"
    finally:
        close_client(zk)
        node.send_signal(signal.SIGTERM)
        _, err = node.communicate(timeout=30)
    assert node.returncode == 0, err
    assert "pw-9f3" not in err


def test_certificates_replaced_on_disk_are_used_by_the_next_connection(tls_zk, tmp_path):
    """A rotation needs no restart: the same setting, files replaced with ``mv``, reaches the
    next connection (kazoo reconnects through the same path). Shown with a certificate the
    server refuses, then the good one back."""
    good = tls_zk.client_tls("rotating")
    rogue = ThrowawayCa(str(tmp_path / "rogue")).issue("rotating")
    live = {"ca": tls_zk.ca.cert, "cert": str(tmp_path / "live.pem"), "key": str(tmp_path / "live.key")}

    def install(cert, key):
        for source, target in ((cert, live["cert"]), (key, live["key"])):
            shutil.copy(source, target + ".new")
            os.replace(target + ".new", target)
    install(good["cert"], good["key"])
    setting = parse_tls(live)
    close_client(start_client(tls_zk.connect, tls=setting))
    install(rogue.cert, rogue.key)
    _connect_fails(tls_zk.connect, setting, "refused this client's certificate")
    install(good["cert"], good["key"])
    close_client(start_client(tls_zk.connect, tls=setting))


@pytest.mark.slow
def test_live_demo_over_tls_only(subprocess_env):
    """``bin/demo --zk-tls``: its ZooKeeper serves TLS only; the coordinators, consumers and
    the demo itself connect with certificates (~40 s here)."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "consumer.cli.demo", "--zk-tls", "--no-spark"],
                          env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for said in ("TLS only", "consumer-3 joined", "consumers kept fetching", "missing 0",
                 "OK: every produced record was consumed"):
        assert said in proc.stdout, proc.stdout


# ---------------------------------------------------------------- on the wire, and through faults

class _Tap:
    """A TCP relay between clients and a server that keeps every byte it passed (the wire)."""

    def __init__(self, target):
        import socket
        import threading
        self.target, self.seen, self.lock = target, bytearray(), threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source, sink):
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    break
                with self.lock:
                    self.seen += data
                sink.sendall(data)
            except OSError:
                break
        for sock in (source, sink):
            sock.close()

    def close(self):
        self.listener.close()


def test_the_wire_carries_no_znode_path_or_data_in_clear(tls_zk, zk_server):
    secret_path, secret_data = f"/wire-{uuid.uuid4().hex}", b"offsets-and-epochs-" + uuid.uuid4().hex.encode()
    for server, tls, visible in ((zk_server.connect.split(",")[0], None, True),
                                 (tls_zk.connect, tls_zk.client_tls("wire"), False)):
        host, port = server.split(":")
        tap = _Tap((host, int(port)))
        try:
            client = start_client(tap.address, tls=tls)
            client.create(secret_path, secret_data)
            assert client.get(secret_path)[0] == secret_data
            client.delete(secret_path)
            close_client(client)
            with tap.lock:
                seen = bytes(tap.seen)
        finally:
            tap.close()
        assert (secret_path.encode() in seen and secret_data in seen) is visible, \
            f"{'plaintext' if visible else 'TLS'}: the path {'should' if visible else 'must not'} be on the wire"


def test_a_server_restart_and_a_session_expiry_over_tls_are_recovered(tmp_path, data_dir):
    from kazoo.client import KazooClient
    with Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk"), tls=True) as ens:
        connect, member = ens.connect + "/app", ens.client_tls("member")
        node = Coordinator(connect, "n0", CoordinatorConfig(**FAST, zk_tls=ens.client_tls("coordinator"))).start()
        with Producer(connect, data_dir=data_dir, zk_tls=member, auto_create_topics=True,
                      auto_create_partitions=2) as producer:
            producer.send("events", b"before", partition=0)
        consumer = Consumer("g", ["events"], zk=connect, data_dir=data_dir, zk_tls=member, session_timeout_ms=1500,
                            auto_offset_reset="earliest", enable_auto_commit=False)
        try:
            _until_value(consumer, b"before", "a record before the restart")
            consumer.commit()
            ens.servers[0].stop()
            ens.restart(0)
            with Producer(connect, data_dir=data_dir, zk_tls=member) as producer:
                producer.send("events", b"after-restart", partition=1)
            _until_value(consumer, b"after-restart", "fetching again after the server restart")
            consumer.commit()
            # expire the node's session for real: a twin with its id and password, over TLS too
            twin = KazooClient(hosts=ens.connect, client_id=node.client.client_id, use_ssl=True,
                               **{k: v for k, v in parse_tls(ens.client_tls("twin")).kazoo_options().items()
                                  if k != "use_ssl"})
            twin.start(timeout=10)
            twin.stop()
            twin.close()
            wait_for(lambda: node.is_leader and node.elected.is_set(), 30, message="the node leads again")
            with Producer(connect, data_dir=data_dir, zk_tls=member) as producer:
                producer.send("events", b"after-expiry", partition=0)
            _until_value(consumer, b"after-expiry", "fetching after the expiry")
        finally:
            consumer.close()
            node.close()


def test_spark_entry_points_carry_file_names_only(tmp_path):
    """zkgroups-pipeline's --zk-tls-* and the source's zkTls* options reach the workers as file
    names (a key password as its @file); a literal password cannot be carried (one line, not shown)."""
    from consumer.cli.pipeline import _worker_config
    from consumer.spark.source import SourceOptions
    from coordinator.zktls import ZkTls
    ca = ThrowawayCa(str(tmp_path / "ca"))
    locked = ca.issue("locked", password="s3cret")
    (tmp_path / "pass").write_text("s3cret\n")
    by_file = ZkTls(ca.cert, locked.cert, locked.key, "@" + str(tmp_path / "pass"))
    carried = {"ca": ca.cert, "cert": locked.cert, "key": locked.key, "key_password": "@" + str(tmp_path / "pass"),
               "verify_hostname": True}
    assert _worker_config(None, None, by_file) == {"zk_tls": carried}
    options = SourceOptions({"zk": "h:1", "topic": "t", "zkTlsCa": ca.cert, "zkTlsCert": locked.cert,
                             "zkTlsKey": locked.key, "zkTlsKeyPasswordFile": str(tmp_path / "pass")})
    assert options.zk_tls == carried
    with pytest.raises(InvalidConfig, match="key password as @FILE") as refused:
        _worker_config(None, None, ZkTls(ca.cert, locked.cert, locked.key, "s3cret"))
    assert "s3cret" not in str(refused.value)
    with pytest.raises(ValueError, match="zkTls"):
        SourceOptions({"zk": "h:1", "topic": "t", "zkTlsKeyPasswordFile": str(tmp_path / "pass")})
