"""ZooKeeper ACLs: the policy table (pure), an installation run with identities end to end,
the attacks a group member and a stranger can try (each refused, the system keeps working),
``groupctl acl apply / check`` on an open installation, and bad credentials."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, Id

from consumer.consumer import Consumer
from coordinator import acl, protocol
from coordinator.acl import ALL, C, D, R, W
from coordinator.coordinator import Coordinator
from coordinator.errors import AuthFailed, InvalidConfig
from coordinator.zkclient import close_client, start_client
from tests.support.groups import FAST, wait_stable
from tests.support.helpers import GROUPCTL, assert_one_line_error, fill, ok, wait_for

ADMIN, COORD, GROUP_A, GROUP_B, STRANGER = ("admin:s3cret-admin", "coord:s3cret-coord", "alpha:s3cret-alpha",
                                            "beta:s3cret-beta", "eve:guess")


def _id(cred: str) -> str:
    return acl.parse_auth(cred).digest_id


POLICY = protocol.AclPolicy(coordinator=_id(COORD), admin=_id(ADMIN),
                            groups={"ga": _id(GROUP_A), "gb": _id(GROUP_B)})


def _perms(policy, path):
    """{user (or world): permissions} of the ACL ``path`` gets."""
    return {(a.id.id.split(":")[0] if a.id.scheme == "digest" else a.id.id): a.perms
            for a in acl.acl_for(policy, path)}


# ---------------------------------------------------------------- the table (pure)

@pytest.mark.parametrize("path, expected", [
    # coordinators: their own znodes, every group's state and command channels
    (protocol.LEADER, {"admin": ALL, "coord": R | W | C | D, "anyone": R}),
    (protocol.EPOCH, {"admin": ALL, "coord": R | W | C | D, "anyone": R}),
    (protocol.ELECTION, {"admin": ALL, "coord": R | W | C | D, "anyone": R}),
    (protocol.shard_epoch_path(3), {"admin": ALL, "coord": R | W | C | D, "anyone": R}),
    (protocol.state_path("ga"), {"admin": ALL, "coord": R | W | C | D, "anyone": R}),
    # a channel: coordinators create and remove commands, the group's members delete them (acks)
    (protocol.channel_path("ga", "m1"), {"admin": ALL, "coord": R | C | D, "alpha": R | D, "anyone": R}),
    (protocol.command_prefix("ga", "m1"), {"admin": ALL, "coord": R | W | C | D, "anyone": R}),
    (protocol.channel_path("ga"), {"admin": ALL, "alpha": R | C, "anyone": R}),
    # the group's members: registrations, owners, offsets of their own group only
    (protocol.ids_path("ga"), {"admin": ALL, "alpha": R | C | D, "anyone": R}),
    (protocol.ids_path("ga", "m1"), {"admin": ALL, "alpha": R | W | C | D, "anyone": R}),
    (protocol.owners_path("gb", "t"), {"admin": ALL, "beta": R | C | D, "anyone": R}),
    (protocol.owners_path("gb", "t", 0), {"admin": ALL, "beta": R | W | C | D, "anyone": R}),
    (protocol.offsets_path("ga", "t", 0), {"admin": ALL, "alpha": R | W | C | D, "anyone": R}),
    (protocol.group_path("ga"), {"admin": ALL, "coord": R | C, "alpha": R | C, "anyone": R}),
    # admins: topics, the policy; the mirror (a coordinator) keeps /brokers/topics
    (protocol.topic_path("t"), {"admin": ALL, "coord": R | W, "anyone": R}),
    (protocol.BROKER_TOPICS, {"admin": ALL, "coord": R | C | D, "anyone": R}),
    (protocol.ACL_POLICY, {"admin": ALL, "anyone": R}),
    # a group nobody is bound to: no member may write there
    (protocol.offsets_path("unbound", "t", 0), {"admin": ALL, "anyone": R}),
    (protocol.state_path("unbound"), {"admin": ALL, "coord": R | W | C | D, "anyone": R}),
    # share groups: members make their znodes; the coordinator writes share-partitions (locks that end)
    (protocol.SHARE_GROUPS, {"admin": ALL, "coord": R | C, "alpha": R | C, "beta": R | C, "anyone": R}),
    (protocol.share_group_path("ga"), {"admin": ALL, "coord": R | W | C, "alpha": R | W | C, "anyone": R}),
    (protocol.share_members_path("ga"), {"admin": ALL, "alpha": R | C | D, "anyone": R}),
    (protocol.share_members_path("ga", "m1"), {"admin": ALL, "alpha": R | W | C | D, "anyone": R}),
    (protocol.share_partitions_path("gb", "t"), {"admin": ALL, "beta": R | C | D, "anyone": R}),
    (protocol.share_partitions_path("gb", "t", 0), {"admin": ALL, "coord": R | W, "beta": R | W | C | D,
                                                     "anyone": R}),
    (protocol.share_partitions_path("unbound", "t", 0), {"admin": ALL, "coord": R | W, "anyone": R}),
])
def test_policy_table(path, expected):
    assert _perms(POLICY, path) == expected


def test_no_world_read_names_every_reader_and_grants_nobody_else():
    closed = protocol.AclPolicy(POLICY.coordinator, POLICY.admin, POLICY.groups, world_read=False)
    perms = _perms(closed, protocol.topic_path("t"))
    assert "anyone" not in perms
    assert perms == {"admin": ALL, "coord": R | W, "alpha": R, "beta": R}


def test_no_group_writes_outside_its_own_group():
    paths = [protocol.ids_path("gb", "m"), protocol.channel_path("gb", "m"), protocol.command_prefix("gb", "m"),
             protocol.owners_path("gb", "t", 0), protocol.offsets_path("gb", "t", 0), protocol.state_path("gb"),
             protocol.LEADER, protocol.EPOCH, protocol.topic_path("t"), protocol.BROKER_TOPICS, protocol.ACL_POLICY,
             protocol.shard_path(0), protocol.node_path("n"), protocol.share_group_path("gb"),
             protocol.share_members_path("gb", "m"), protocol.share_partitions_path("gb", "t", 0)]
    for path in paths:
        assert _perms(POLICY, path).get("alpha", 0) & ~R == 0, path


def test_credentials_never_show_the_password(tmp_path):
    cred = acl.parse_auth("user:hunter2")
    assert "hunter2" not in repr(cred) + str(cred)
    secret = tmp_path / "secret"
    secret.write_text("user:hunter2\n")
    assert acl.parse_auth(f"@{secret}") == cred
    for bad, match in [("nocolon", "malformed"), (":pw", "malformed"), ("user:", "malformed"),
                       (f"@{tmp_path}/missing", "does not exist"), ("@", "file name"), (f"@{tmp_path}", "directory")]:
        with pytest.raises(InvalidConfig, match=match) as e:
            acl.parse_auth(bad)
        assert "hunter2" not in str(e.value)
    assert acl.digest_id("user", "hunter2") == "user:" + __import__("base64").b64encode(
        __import__("hashlib").sha1(b"user:hunter2").digest()).decode()


def test_policy_znode_round_trips_and_rejects_junk():
    assert protocol.AclPolicy.decode(POLICY.encode(), "/p") == POLICY
    from coordinator.errors import CorruptZnode
    with pytest.raises(CorruptZnode):
        protocol.AclPolicy.decode(b'{"version":1,"coordinator":"x","admin":"y"}', "/p")


# ---------------------------------------------------------------- a secured installation

def _groupctl(zk_connect, data_dir, *args, env=None, auth=ADMIN):
    from click.testing import CliRunner
    from consumer.cli.groupctl import main
    base = ["--zk", zk_connect, "--data-dir", data_dir] + (["--zk-auth", auth] if auth else [])
    return CliRunner().invoke(main, base + list(args))


@pytest.fixture
def secured(zk_connect, data_dir):
    """An installation with a policy: admin, coordinators, groups ga and gb, topic t (4 partitions)."""
    result = _groupctl(zk_connect, data_dir, "acl", "apply", "--coordinator", COORD,
                       "--group", f"ga={GROUP_A}", "--group", f"gb=digest:{_id(GROUP_B)}")
    ok(result)
    ok(_groupctl(zk_connect, data_dir, "topics", "create", "t", "--partitions", "4"))
    return zk_connect


def _client(connect, cred, **kw):
    return start_client(connect, 4000, auth=cred, **kw)


def test_secured_installation_works_and_refuses_every_attack(secured, data_dir):
    connect = secured
    fill(data_dir, "t", [5, 5, 5, 5])
    node = Coordinator(connect, "n1", protocol_config(zk_auth=COORD)).start()
    consumers = []
    member_a = stranger = None
    try:
        wait_for(lambda: node.is_leader, 15, message="the coordinator leads")
        consumers = [Consumer(g, ["t"], zk=connect, data_dir=data_dir, zk_auth=cred, auto_offset_reset="earliest",
                              session_timeout_ms=2000)
                     for g, cred in (("ga", GROUP_A), ("ga", GROUP_A), ("gb", GROUP_B))]
        got = {c: 0 for c in consumers}

        def drained():
            for c in consumers:
                got[c] += sum(len(rs) for rs in c.poll(timeout_ms=50).values())
            return got[consumers[0]] + got[consumers[1]] == 20 and got[consumers[2]] == 20
        wait_for(drained, 30, message="both groups consume every record")
        for c in consumers:
            c.commit()

        admin = _client(connect, ADMIN)
        state_b = wait_stable(admin, "gb", 1)
        member_b = state_b.members[0]
        member_a = _client(connect, GROUP_A)
        stranger = start_client(connect, 4000)  # no identity at all
        attacks = _attacks(member_b)
        for who, client in (("member of ga", member_a), ("stranger", stranger)):
            for name, attack in attacks:
                with pytest.raises(NoAuthError):
                    attack(client)
                    pytest.fail(f"{who} could {name}")
        # within group a too, one member cannot forge commands for another (only coordinators create there)
        state_a = wait_stable(admin, "ga", 2)
        with pytest.raises(NoAuthError):
            member_a.create(protocol.command_prefix("ga", state_a.members[1]), forged_for(state_a.members[1]),
                            sequence=True)
        # ... and the system keeps working: a new record reaches group b
        fill(data_dir, "t", [1], zk=None)
        wait_for(lambda: sum(len(rs) for rs in consumers[2].poll(timeout_ms=50).values()) > 0, 15,
                 message="group b consumes after the attacks")
        assert wait_stable(admin, "gb", 1).state == protocol.STABLE
        close_client(admin)
        # every znode the running system created (members' ensure_path parents included) has its policy ACL
        check = _groupctl(connect, data_dir, "acl", "check", auth=None)
        assert check.exit_code == 0, check.output
        assert "0 not as the policy says" in check.stdout
    finally:
        for c in consumers:
            c.close()
        node.close()
        for c in (member_a, stranger):
            if c is not None:
                close_client(c)
    # the admin's commands: resets and deletes; another group's identity may do neither (a group's own
    # identity may write its own offsets: the residual risk docs/operations/security.md names)
    refused = _groupctl(connect, data_dir, "groups", "delete", "gb", auth=GROUP_B)
    assert refused.exit_code == 1 and "NoAuthError" in refused.stderr, refused.output
    refused = _groupctl(connect, data_dir, "groups", "reset-offsets", "gb", "--topic", "t", "--to-earliest",
                        "--execute", auth=GROUP_A)
    assert refused.exit_code == 1 and "NoAuthError" in refused.stderr, refused.output
    ok(_groupctl(connect, data_dir, "groups", "reset-offsets", "gb", "--topic", "t", "--to-earliest", "--execute"))
    ok(_groupctl(connect, data_dir, "groups", "delete", "ga"))


def protocol_config(**kw):
    from coordinator.coordinator import CoordinatorConfig
    return CoordinatorConfig(**{**FAST, "session_timeout_ms": 2000, **kw})


def forged_for(member: str) -> bytes:
    return protocol.Command(protocol.START_FETCHER, 99, 99, {"t": {0: member + "-0"}}, consumer_id=member).encode()


def _attacks(member_b: str):
    """What a member of another group, or a stranger, must not be able to do."""
    forged = forged_for(member_b)

    return [
        ("set group b's offsets", lambda c: c.set(protocol.offsets_path("gb", "t", 0), b"0")),
        ("forge a start command", lambda c: c.create(protocol.command_prefix("gb", member_b), forged, sequence=True)),
        ("delete (ack) group b's commands",
         lambda c: c.delete(protocol.command_prefix("gb", member_b) + "0000000000")),
        ("delete group b's command channel",
         lambda c: c.delete(protocol.channel_path("gb", member_b), recursive=True)),
        ("delete group b's owner node", lambda c: c.delete(protocol.owners_path("gb", "t", 0))),
        ("claim group b's partition", lambda c: c.create(protocol.owners_path("gb", "t", 9), b"x", ephemeral=True)),
        ("rewrite the epoch", lambda c: c.set(protocol.EPOCH, b"1")),
        ("rewrite the leader", lambda c: c.set(protocol.LEADER, b"{}")),
        ("rewrite group b's state", lambda c: c.set(protocol.state_path("gb"), b"{}")),
        ("register in group b", lambda c: c.create(protocol.ids_path("gb", "gb_intruder"), b"{}", ephemeral=True)),
        ("create a topic", lambda c: c.create(protocol.topic_path("evil"), protocol.encode_topic(1))),
        ("resize a topic", lambda c: c.set(protocol.topic_path("t"), protocol.encode_topic(8))),
        ("rewrite the policy", lambda c: c.set(protocol.ACL_POLICY, b"{}")),
        ("change an ACL", lambda c: c.set_acls(protocol.state_path("gb"), acl.open_acl())),
    ]


# ---------------------------------------------------------------- upgrading an open installation

def test_check_reports_an_open_installation_and_apply_fixes_it_once(cluster, data_dir):
    connect = cluster.connect
    fill(data_dir, "t", [3, 3], zk=cluster.client())
    cluster.node("n1")
    member = cluster.member("ga", ["t"])
    wait_stable(cluster.client(), "ga", 1)
    member.close(timeout=5)
    cluster.members.remove(member)

    check = _groupctl(connect, data_dir, "acl", "check", auth=None)
    assert check.exit_code == 1
    assert "open installation" in check.stdout
    assert f"{protocol.state_path('ga')}: world:anyone may write,create,delete,admin" in check.stdout
    assert_one_line_error(check.exit_code, "", check.stderr, "do not match the ACL policy")

    refused = _groupctl(connect, data_dir, "acl", "apply", "--coordinator", COORD)
    assert refused.exit_code == 1 and "groups without an identity: ga" in refused.stderr
    assert "open installation" in _groupctl(connect, data_dir, "acl", "check", auth=None).stdout  # nothing changed

    first = ok(_groupctl(connect, data_dir, "acl", "apply", "--coordinator", COORD, "--group", f"ga={GROUP_A}"))
    assert " 0 znodes changed" not in first
    check = _groupctl(connect, data_dir, "acl", "check", auth=None)
    assert check.exit_code == 0, check.output
    assert "ACL policy applied: 0 znodes changed" in ok(_groupctl(connect, data_dir, "acl", "apply"))

    # the running open coordinator may no longer write; one started with its identity leads the group
    for node in cluster.nodes:
        node.close()
    cluster.nodes.clear()
    cluster.config.zk_auth = acl.parse_auth(COORD)
    cluster.node("n2")
    with Consumer("ga", ["t"], zk=connect, data_dir=data_dir, zk_auth=GROUP_A, auto_offset_reset="earliest",
                  session_timeout_ms=2000) as c:
        got = []
        wait_for(lambda: got.extend(r for rs in c.poll(timeout_ms=50).values() for r in rs) or len(got) >= 6, 30,
                 message="the upgraded group consumes")
    assert _groupctl(connect, data_dir, "acl", "check", auth=None).exit_code == 0


# ---------------------------------------------------------------- bad identities

def test_bad_identities_are_one_line_in_bounded_time(secured, data_dir, tmp_path, subprocess_env):
    wrong = tmp_path / "wrong"
    wrong.write_text("alpha:not-the-password\n")
    cases = [
        (["--zk-auth", "no-colon-here"], "malformed"),
        (["--zk-auth", f"@{tmp_path}/missing"], "does not exist"),
        (["--zk-auth", f"@{wrong}"], "wrong password for ZooKeeper identity 'alpha'"),
        (["--zk-auth", STRANGER], "identity 'eve' is not in this installation's ACL policy"),
    ]
    proc = subprocess.run([sys.executable, "-m", "consumer.cli.coordinatord", "--zk", secured, "--zk-auth", GROUP_A],
                          capture_output=True, text=True, env=subprocess_env, timeout=60)
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "identity 'alpha' belongs to a group here, "
                          "not to the coordinators or admins")
    for auth, match in cases:
        for tool in (GROUPCTL + ["--zk", secured, *auth, "groups", "list"],
                     [sys.executable, "-m", "consumer.cli.coordinatord", "--zk", secured, "--zk-timeout", "5",
                      *auth],
                     GROUPCTL + ["--zk", secured, "--data-dir", data_dir, *auth, "consume", "ga", "t",
                                 "--max-records", "1"],
                     [sys.executable, "-m", "consumer.cli.pipeline", "--zk", secured, "--data-dir", data_dir, *auth,
                      "--group", "ga", "--topic", "t", "--out", str(tmp_path / "out")]):
            started = time.monotonic()
            proc = subprocess.run(tool, capture_output=True, text=True, env=subprocess_env, timeout=60)
            assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, match)
            assert "not-the-password" not in proc.stdout + proc.stderr and "guess" not in proc.stderr
            assert time.monotonic() - started < 30


# ---------------------------------------------------------------- secrets stay secret

def test_secrets_appear_in_no_process_listing_output_or_log(secured, data_dir, tmp_path, subprocess_env):
    password = COORD.split(":", 1)[1]
    secret = tmp_path / "coord.secret"
    secret.write_text(COORD + "\n")
    secret.chmod(0o600)
    node = subprocess.Popen([sys.executable, "-m", "consumer.cli.coordinatord", "--zk", secured,
                             "--zk-auth", f"@{secret}", "--log-level", "DEBUG", "--node-id", "n-secret"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env)
    admin = _client(secured, ADMIN)
    try:
        wait_for(lambda: admin.exists(protocol.LEADER), 20, message="the node leads")
        with open(f"/proc/{node.pid}/cmdline", "rb") as f:
            cmdline = f.read()
        assert str(secret).encode() in cmdline and password.encode() not in cmdline
        consume_env = {**subprocess_env, "ZK_AUTH": f"@{tmp_path / 'alpha.secret'}"}
        (tmp_path / "alpha.secret").write_text(GROUP_A)
        fill(data_dir, "t", [1, 1, 1, 1])
        consume = subprocess.run(GROUPCTL + ["--zk", secured, "--data-dir", data_dir, "-vv", "consume", "ga", "t",
                                             "--from-beginning", "--max-records", "4"],
                                 capture_output=True, text=True, env=consume_env, timeout=60)
        assert consume.returncode == 0, consume.stderr
        assert GROUP_A.split(":", 1)[1] not in consume.stdout + consume.stderr
        helped = subprocess.run(GROUPCTL + ["--help"], capture_output=True, text=True, timeout=60,
                                env={**subprocess_env, "ZK_AUTH": COORD})
        assert "--zk-auth" in helped.stdout and password not in helped.stdout
        from coordinator.coordinator import CoordinatorConfig
        from consumer.consumer import ConsumerConfig
        assert password not in repr(CoordinatorConfig(zk_auth=COORD)) + repr(ConsumerConfig(zk_auth=COORD))
    finally:
        node.terminate()
        out, err = node.communicate(timeout=30)
        close_client(admin)
    assert "leads" in err or "elected" in err or "started" in err, err[-2000:]
    assert password not in out + err


def test_joining_a_group_of_another_identity_is_one_line(secured, data_dir, subprocess_env, tmp_path):
    for auth in (["--zk-auth", GROUP_A], []):
        proc = subprocess.run(GROUPCTL + ["--zk", secured, "--data-dir", data_dir, *auth, "consume", "gb", "t",
                                          "--max-records", "1"],
                              capture_output=True, text=True, env=subprocess_env, timeout=60)
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "cannot join group gb: ZooKeeper refused")
        assert proc.returncode == 1


def test_without_world_read_strangers_read_nothing_and_groups_still_work(zk_connect, data_dir):
    ok(_groupctl(zk_connect, data_dir, "acl", "apply", "--coordinator", COORD, "--group", f"ga={GROUP_A}",
                 "--no-world-read"))
    ok(_groupctl(zk_connect, data_dir, "topics", "create", "t", "--partitions", "2"))
    fill(data_dir, "t", [2, 2])
    node = Coordinator(zk_connect, "n1", protocol_config(zk_auth=COORD)).start()
    stranger = start_client(zk_connect, 4000)
    try:
        with Consumer("ga", ["t"], zk=zk_connect, data_dir=data_dir, zk_auth=GROUP_A, auto_offset_reset="earliest",
                      session_timeout_ms=2000) as c:
            got = []
            wait_for(lambda: got.extend(r for rs in c.poll(timeout_ms=50).values() for r in rs) or len(got) >= 4,
                     30, message="the group consumes")
        for path in (protocol.state_path("ga"), protocol.topic_path("t"), protocol.EPOCH, protocol.ACL_POLICY):
            with pytest.raises(NoAuthError):
                stranger.get(path)
        with pytest.raises(AuthFailed, match="may not read the ACL policy"):
            start_client(zk_connect, 4000, auth=STRANGER)
    finally:
        close_client(stranger)
        node.close()
    check = _groupctl(zk_connect, data_dir, "acl", "check")
    assert check.exit_code == 0, check.output


def test_weaker_and_missing_match_redacted_digests_by_user():
    expected = acl.acl_for(POLICY, protocol.state_path("ga"))
    redacted = [ACL(a.perms, Id(a.id.scheme, a.id.id.split(":")[0] + ":x") if a.id.scheme == "digest" else a.id)
                for a in expected]
    assert acl.weaker(redacted, expected) == [] and not acl.missing(redacted, expected)
    wider = redacted + [ACL(W, Id("digest", "alpha:x"))]
    assert acl.weaker(wider, expected) == ["digest:alpha may write"]
    assert acl.missing([a for a in redacted if a.id.id.split(":")[0] != "coord"], expected)
    assert acl.weaker(acl.open_acl(), expected) == ["world:anyone may write,create,delete,admin"]


def test_producer_with_an_admin_identity_creates_topics_a_group_cannot(secured, data_dir):
    from consumer.producer import Producer
    with Producer(secured, data_dir=data_dir, zk_auth=ADMIN, auto_create_topics=True) as p:
        p.send("made-by-admin", b"v").get(timeout=10)
    admin = _client(secured, ADMIN)
    try:
        assert acl.same_acl(admin.get_acls(protocol.topic_path("made-by-admin"))[0],
                            acl.acl_for(POLICY, protocol.topic_path("made-by-admin")))
    finally:
        close_client(admin)
    with Producer(secured, data_dir=data_dir, zk_auth=GROUP_A, auto_create_topics=True) as p:
        with pytest.raises(Exception) as refused:
            p.send("made-by-member", b"v").get(timeout=10)
    assert "NoAuth" in type(refused.value).__name__ + str(refused.value)


def test_zk_auth_in_toml_files(tmp_path, subprocess_env):
    config = tmp_path / "coordinator.toml"
    config.write_text(f'zk = "127.0.0.1:1"\nzk_auth = "@{tmp_path}/missing"\n')
    proc = subprocess.run([sys.executable, "-m", "consumer.cli.coordinatord", "--config", str(config)],
                          capture_output=True, text=True, env=subprocess_env, timeout=60)
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, f"zk_auth file {tmp_path}/missing does not exist")
    config.write_text('zk_auth = 5\n')
    with pytest.raises(InvalidConfig, match="zk_auth must be text"):
        from coordinator.config import build, load_toml
        from coordinator.coordinator import CoordinatorConfig
        build(CoordinatorConfig, load_toml(str(config), "coordinator"))
    from consumer.consumer import ConsumerConfig
    from coordinator.config import build
    assert build(ConsumerConfig, {"zk-auth": GROUP_A}).zk_auth.user == "alpha"


def test_parents_made_by_ensure_path_and_makepath_get_their_own_acls(secured):
    admin = _client(secured, ADMIN)
    try:
        admin.ensure_path(protocol.offsets_path("gnew", "t"))
        admin.create(protocol.spark_stop_path("run1"), b"", makepath=True)
        for path in (protocol.group_path("gnew"), protocol.offsets_path("gnew"), protocol.offsets_path("gnew", "t"),
                     "/zkgroups-spark", protocol.SPARK_STOP, protocol.spark_stop_path("run1")):
            assert acl.same_acl(admin.get_acls(path)[0], acl.acl_for(POLICY, path)), path
        # the parents differ from their leaf: kazoo alone would have given them the leaf's ACL
        assert not acl.same_acl(acl.acl_for(POLICY, protocol.SPARK_STOP), acl.acl_for(POLICY, protocol.spark_stop_path("r")))
        assert not acl.same_acl(acl.acl_for(POLICY, protocol.group_path("gnew")),
                                acl.acl_for(POLICY, protocol.offsets_path("gnew", "t")))
    finally:
        close_client(admin)


def test_a_share_group_works_in_a_secured_installation_and_others_cannot_touch_it(secured, data_dir):
    from consumer import ShareConsumer
    from coordinator.protocol.share import ShareGroupConfig
    fill(data_dir, "t", [3, 0, 0, 0])
    admin = _client(secured, ADMIN)
    admin.ensure_path(protocol.share_group_path("ga"))
    admin.set(protocol.share_group_path("ga"),
              ShareGroupConfig(auto_offset_reset="earliest", lock_duration_ms=1000).encode())
    node = Coordinator(secured, "n1", protocol_config(zk_auth=COORD)).start()
    consumers, other = [], None
    try:
        wait_for(lambda: node.is_leader, 15, message="the coordinator leads")
        slow = ShareConsumer("ga", ["t"], zk=secured, data_dir=data_dir, zk_auth=GROUP_A,
                             share_acknowledgement_mode="explicit")
        consumers.append(slow)
        held = []
        wait_for(lambda: held.extend(slow.poll(50)) or len(held) == 3, 15, message="three records")
        fast = ShareConsumer("ga", ["t"], zk=secured, data_dir=data_dir, zk_auth=GROUP_A)
        consumers.append(fast)
        again = []   # the coordinator (its own identity) ended the lock: it may write the share-partition
        wait_for(lambda: again.extend(fast.poll(50)) or len(again) == 3, 15, message="redelivered")
        other = _client(secured, GROUP_B)
        with pytest.raises(NoAuthError):
            other.set(protocol.share_partitions_path("ga", "t", 0), b"{}")
        with pytest.raises(NoAuthError):
            other.create(protocol.share_members_path("ga", "intruder"), b"{}", ephemeral=True)
    finally:
        for c in consumers:
            c.close()
        node.close()
        close_client(admin)
        if other is not None:
            close_client(other)
