"""``bin/chaos``'s network of namespaces (:mod:`tests.chaos.network`) and its fault plan: names,
addresses and rules as pure functions; then, where the machine allows namespaces (root, ``ip``,
``nft``), a real cut between two namespaces, its heal with a reset, and the removal of what a
run killed mid-way left behind."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.chaos import network
from tests.chaos.network import (FAMILY, Network, NetworkError, cut_rules, free_subnet, loopback_rules, next_slot,
                                 prefixes_in, run_prefix)
from tests.chaos.run import Options, fault_plan, parse_args


def test_names_of_a_run_and_what_belongs_to_the_family():
    assert run_prefix(0x5a1) == "zc0005a1" and run_prefix(4194304) == "zc400000"
    names = ["zc0005a1-hub", "zc0005a1-consumer-012", "zc0005a1h", "zc00ffeeh", "eth0", "zcafe", "docker0",
             "zc0005a1-", "zc0005a1br", "zc0005a1h@if3"]
    assert prefixes_in(names) == {"zc0005a1", "zc00ffee"}
    assert not FAMILY.match("zc0005a1-Upper") and not FAMILY.match("zc0005a1-a b")


def test_the_subnet_is_the_first_free_one_and_slots_go_round():
    assert str(free_subnet(["127.0.0.1/8", "192.0.2.2/24"])) == "10.213.0.0/24"
    assert str(free_subnet(["10.213.0.1/24", "10.213.1.7/24"])) == "10.213.2.0/24"
    assert str(free_subnet(["10.0.0.0/8"] if False else ["10.213.0.0/23"])) == "10.213.2.0/24"
    with pytest.raises(NetworkError):
        free_subnet(["10.0.0.0/8"])
    assert next_slot(1, set()) == 2 and next_slot(2, {3}) == 4
    assert next_slot(254, {2}) == 3  # wraps, skipping the used
    with pytest.raises(NetworkError):
        next_slot(5, set(range(2, 255)))


def test_cut_rules_both_ways_one_way_and_whole_hosts():
    both = cut_rules(["10.213.0.2", "10.213.0.3"], 2181, oneway=False)
    assert "ip saddr { 10.213.0.2, 10.213.0.3 } tcp sport 2181 drop" in both
    assert "ip daddr { 10.213.0.2, 10.213.0.3 } tcp dport 2181 drop" in both
    assert both.startswith("table inet zkchaos {") and "hook input" in both and "hook output" in both
    oneway = cut_rules(["10.213.0.2"], 2181, oneway=True)
    assert "hook input" in oneway and "hook output" not in oneway  # requests go out, answers are dropped
    whole = cut_rules(["10.213.0.5"], None, oneway=False)
    assert "ip saddr { 10.213.0.5 } drop" in whole and "tcp" not in whole
    assert 'iifname "eth0" tcp dport { 4001, 4002 } dnat to 127.0.0.1' in loopback_rules([4001, 4002])


def test_fault_plan_every_kind_once_or_as_given_with_stand_ins_without_namespaces():
    everything = fault_plan(Options(seed=1), True, random.Random(1))
    assert sorted(everything) == sorted(["kill", "term", "pause", "leader-kill", "zk-restart", "quorum-loss",
                                         "cut-consumer", "cut-oneway", "cut-controller", "cut-node", "zk-minority"])
    on_kafka = fault_plan(Options(seed=1, data_plane="kafka"), True, random.Random(1))
    assert "broker-down" in on_kafka and len(on_kafka) == 12
    assert sorted(fault_plan(Options(seed=1), False, random.Random(1))) == sorted(
        ["kill", "term", "pause", "leader-kill", "zk-restart", "quorum-loss"])
    given = Options(seed=1, faults=["cut-consumer", "cut-node", "cut-consumer", "zk-minority"])
    assert fault_plan(given, True, random.Random(1)) == given.faults
    assert fault_plan(given, False, random.Random(1)) == ["pause", "leader-kill", "pause", "zk-restart"]


@pytest.mark.parametrize("argv, message", [
    (["--faults", "cut-consumer,nap"], "unknown kind 'nap'"),
    (["--faults", ","], "give at least one kind"),
    (["--faults", "broker-down"], "broker-down needs --data-plane kafka"),
    (["--network", "vlan"], "invalid choice"),
])
def test_bad_options_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.count("\n") == 1


# ---------------------------------------------------------------- real namespaces

needs_namespaces = pytest.mark.skipif(network.unavailable() is not None,
                                      reason=f"network namespaces: {network.unavailable()}")

ECHO = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 2181)); s.listen(); print("listening", flush=True)
    c, _ = s.accept()
    try:
        while True:
            data = c.recv(100)
            if not data:
                print("closed", flush=True); break
            c.sendall(data)
    except OSError as e:
        print(type(e).__name__, flush=True)
""")


def _connect(place, address):
    """A socket to ``address``:2181 made inside ``place``: setns on this thread is not
    possible in pytest, so a helper process holds it and relays what it sees."""
    code = textwrap.dedent(f"""
        import socket, sys
        c = socket.create_connection(("{address}", 2181), timeout=3)
        for line in sys.stdin:
            try:
                c.settimeout(float(line)); c.sendall(b"x"); print(c.recv(10) and "echo", flush=True)
            except OSError as e:
                print(type(e).__name__, flush=True)
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=place.preexec)


def _ask(client, timeout):
    client.stdin.write(f"{timeout}\n")
    client.stdin.flush()
    return client.stdout.readline().strip()


@needs_namespaces
def test_a_cut_drops_both_ways_and_a_heal_with_reset_aborts_both_ends():
    net = Network().start()
    server = client = None
    try:
        zk, consumer = net.add("zk1"), net.add("consumer-001")
        assert zk.address.startswith(str(net.subnet.network_address)[:-1]) and zk.address != consumer.address
        server = subprocess.Popen([sys.executable, "-c", ECHO, zk.address], stdout=subprocess.PIPE, text=True,
                                  preexec_fn=zk.preexec)
        assert server.stdout.readline().strip() == "listening"
        with socket.create_connection((zk.address, 2181), timeout=3):  # the host reaches every place
            pass
        assert server.stdout.readline().strip() == "closed"
        server.kill()
        server.wait()
        server = subprocess.Popen([sys.executable, "-c", ECHO, zk.address], stdout=subprocess.PIPE, text=True,
                                  preexec_fn=zk.preexec)
        assert server.stdout.readline().strip() == "listening"
        client = _connect(consumer, zk.address)
        assert _ask(client, 3) == "echo"
        net.cut(consumer, [zk], 2181)
        assert net.is_cut(consumer)
        assert _ask(client, 0.5) == "TimeoutError"  # nothing comes back, and the process runs on
        net.heal(consumer, reset=True)
        assert not net.is_cut(consumer)
        assert server.stdout.readline().strip() in ("ConnectionResetError", "ConnectionAbortedError")
        assert _ask(client, 3) in ("ConnectionAbortedError", "ConnectionResetError", "BrokenPipeError")
    finally:
        for proc in (server, client):
            if proc is not None:
                proc.kill()
                proc.wait()
        net.close()
    assert not [n for n in net._namespaces() if n.startswith(net.prefix)]
    assert not [n for n in net._links() if n.startswith(net.prefix)]


@needs_namespaces
def test_what_a_killed_run_left_is_removed_by_the_next_and_a_live_run_is_left_alone():
    code = ("import os, sys; from tests.chaos.network import Network; n = Network().start(); n.add('zk1'); "
            "n.add('c1'); print(n.prefix, flush=True); sys.stdin.read(); os._exit(0 if sys.argv[1] == 'live' else 1)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    dead = subprocess.run([sys.executable, "-c", code, "dead"], input="", capture_output=True, text=True,
                          cwd=root, timeout=60)
    stale = dead.stdout.strip()
    assert stale in prefixes_in(Network()._namespaces())  # it never closed its network
    live = subprocess.Popen([sys.executable, "-c", code, "live"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=root)
    try:
        alive = live.stdout.readline().strip()  # it started: what the dead run left is gone
        net = Network()
        assert stale not in prefixes_in(net._namespaces()) and stale not in prefixes_in(net._links())
        net.start()
        assert {f"{alive}-zk1", f"{alive}-c1", f"{alive}-hub"} <= set(net._namespaces())  # alive: kept
        net.close()
    finally:
        live.communicate("", timeout=60)
    Network().start().close()  # the live one exited without closing: now it is stale, and goes
    assert alive not in prefixes_in(Network()._namespaces())


def test_without_namespaces_one_line_says_so_and_what_stands_in(monkeypatch, capsys):
    from tests.chaos.run import open_network
    monkeypatch.setattr(network, "unavailable", lambda: "not running as root")
    assert open_network(Options(seed=1)) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "network namespaces are not available here (not running as root)" in err
    assert "cut-consumer -> pause" in err and "zk-minority -> zk-restart" in err
    with pytest.raises(NetworkError, match="not running as root"):
        open_network(Options(seed=1, network="namespaces"))
    assert open_network(Options(seed=1, network="shared")) is None and capsys.readouterr().err == ""
