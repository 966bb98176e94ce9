"""Real network partitions for ``bin/chaos``: each process of the run in a network namespace of its own.

Layout of one run (``<id>`` is the harness's pid in six hex digits, so the names of runs that
are alive at the same time never clash):

* a hub namespace ``zc<id>-hub`` holding a bridge ``br0``; the bridge lives there, not in the
  host's namespace, so the host's firewall (a Docker engine's ``FORWARD`` policy ``drop``, with
  ``bridge-nf-call-iptables`` on) never sees the traffic between places;
* an uplink: a veth pair from the host's namespace (``zc<id>h``, 10.213.<n>.1/24: the first /24
  of 10.213.0.0/16 no interface of the host uses) to a port of the bridge; the harness's own
  clients (its ZooKeeper reads, the Kafka dump) reach every place through it;
* per *place* (a ZooKeeper server, a ``coordinatord`` node, a consumer process, the Kafka
  mock) a namespace ``zc<id>-<label>`` holding ``lo`` and ``eth0`` (10.213.<n>.<slot>/24), the
  inside end of a veth pair whose other end ``v<slot>`` is a port of the bridge. A process
  enters its place in the child, before exec (:meth:`Place.preexec`: ``setns``), so it stays
  the harness's own child (its pid, signals and exit status as before).

Faults are nftables rules in the victim's own namespace (table ``inet zkchaos``), so removing
the namespace removes them too:

* :meth:`Network.cut` drops every packet between the place and its peers (to a port of theirs,
  or all), both ways, or one way: ``oneway`` drops only what comes back (requests reach the
  peers, answers do not);
* :meth:`Network.heal` deletes the table; with ``reset``, every TCP connection between the
  place and those peers is then aborted at both ends (``ss -K``: the kernel sends a RST), as
  a router or firewall that lost its state answers a connection it no longer knows.

:meth:`Network.expose_loopback` makes ports of a server that binds only 127.0.0.1 (librdkafka's
mock brokers) reachable at its place's address: a DNAT rule in its namespace (table
``ip zkchaos_nat``) and ``route_localnet`` on its ``eth0``.

Cleanup: the run holds ``/run/zkgroups-chaos/zc<id>.lock`` (``flock``) for its whole life;
:meth:`Network.start` first removes every namespace and link of the ``zc<6 hex>`` family whose
lock nobody holds (a run that crashed or was killed: its processes died with it, by
PR_SET_PDEATHSIG), and :meth:`Network.close` removes the run's own. A stale namespace from an
earlier run therefore never breaks the next, and a run alive next to this one is left alone.

:func:`unavailable` says in one line why namespaces cannot be used here (not root, no ``ip``
or ``nft``), or None. Thread rules: one thread (the harness's loop) calls everything.
"""
from __future__ import annotations

import contextlib
import ctypes
import enum
import fcntl
import ipaddress
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set

from coordinator.testing.zkserver import die_with_parent

log = logging.getLogger(__name__)

FAMILY = re.compile(r"^(zc[0-9a-f]{6})(?:h|-[a-z0-9-]+)$")  # every name a run makes in the host's namespace
LOCK_DIR = "/run/zkgroups-chaos"
NETNS_DIR = "/run/netns"
SUPERNET = ipaddress.ip_network("10.213.0.0/16")
TABLE = "zkchaos"
CLONE_NEWNET = 0x40000000
COMMAND_TIMEOUT_S = 20.0
FIRST_SLOT, LAST_SLOT = 2, 254  # .1 is the host's address


class NetworkError(RuntimeError):
    """A namespace, link or rule could not be made (one line: the command and what it said)."""


def unavailable() -> Optional[str]:
    """Why namespaces cannot be used on this machine, or None when they can be tried."""
    if os.geteuid() != 0:
        return "not running as root"
    missing = [tool for tool in ("ip", "nft", "ss") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (apt-get install iproute2 nftables)"
    if not os.path.isdir("/proc/self/ns") or not os.path.exists("/proc/self/ns/net"):
        return "the kernel has no network namespaces"
    return None


def run_prefix(pid: int) -> str:
    return f"zc{pid:06x}"


def prefixes_in(names: Iterable[str]) -> Set[str]:
    """The run prefixes of the family's names among ``names`` (namespaces, links)."""
    return {m.group(1) for m in (FAMILY.match(name) for name in names) if m}


def free_subnet(used: Iterable[str]) -> ipaddress.IPv4Network:
    """The first /24 of :data:`SUPERNET` that overlaps none of the ``used`` networks (CIDR strings)."""
    taken = [ipaddress.ip_network(u, strict=False) for u in used]
    for subnet in SUPERNET.subnets(new_prefix=24):
        if not any(subnet.overlaps(t) for t in taken if t.version == 4):
            return subnet
    raise NetworkError(f"no free /24 left in {SUPERNET}")


def next_slot(last: int, used: Set[int]) -> int:
    """The first free slot after ``last`` (wrapping around)."""
    span = LAST_SLOT - FIRST_SLOT + 1
    for step in range(1, span + 1):
        slot = FIRST_SLOT + (last - FIRST_SLOT + step) % span
        if slot not in used:
            return slot
    raise NetworkError("no address left on the bridge")


def cut_rules(peers: Sequence[str], port: Optional[int], oneway: bool) -> str:
    """The nftables table that cuts a place off from ``peers`` (their ``port`` only, or all of
    their traffic): both ways, or (``oneway``) only what the peers send back."""
    addresses = ", ".join(peers)
    incoming = f"ip saddr {{ {addresses} }}" + (f" tcp sport {port}" if port else "")
    outgoing = f"ip daddr {{ {addresses} }}" + (f" tcp dport {port}" if port else "")
    chains = [f"  chain input {{ type filter hook input priority 0; policy accept; {incoming} drop; }}"]
    if not oneway:
        chains.append(f"  chain output {{ type filter hook output priority 0; policy accept; {outgoing} drop; }}")
    return "\n".join([f"table inet {TABLE} {{", *chains, "}"]) + "\n"


def loopback_rules(ports: Sequence[int]) -> str:
    """DNAT of what reaches ``eth0`` on ``ports`` to the namespace's loopback (where a server
    that only binds 127.0.0.1, as librdkafka's mock brokers do, listens)."""
    ports_set = ", ".join(str(p) for p in ports)
    return (f"table ip {TABLE}_nat {{\n  chain prerouting {{ type nat hook prerouting priority dstnat; "
            f"iifname \"eth0\" tcp dport {{ {ports_set} }} dnat to 127.0.0.1; }}\n}}\n")


def enter_namespace(name: str) -> None:
    """``setns`` the calling thread (a fresh child, before exec) into namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({name}): {os.strerror(errno)}")
    finally:
        os.close(fd)


@dataclass
class Place:
    """Where one process (or one process at a time: a node's restarts) runs."""
    label: str
    namespace: str
    slot: int
    address: str

    @property
    def hub_link(self) -> str:
        """The veth end on the hub's bridge."""
        return f"v{self.slot}"

    def enter(self) -> None:
        """``preexec_fn`` of a child that sets its own parent-death signal and session."""
        enter_namespace(self.namespace)

    def preexec(self) -> None:
        """``preexec_fn`` of a child that runs here: dies with the harness, lives in the namespace."""
        die_with_parent()
        enter_namespace(self.namespace)


@dataclass
class Cut:
    peers: List[Place]
    port: Optional[int]
    oneway: bool


class NetworkState(enum.Enum):
    NEW = "new"
    STARTED = "started"
    CLOSED = "closed"


class Network:
    """The run's hub and places (see the module docstring). ``say`` gets one line per change.

    States (:class:`NetworkState`)::

        NEW --start()--> STARTED --close()--> CLOSED
        NEW --start() fails--> CLOSED (what it made is removed; NetworkError raised)
        NEW --close()--> CLOSED

    Places are added, cut, healed and removed only while STARTED; ``close()`` again does
    nothing. Thread rules: one thread (the harness's loop) calls everything.
    """

    def __init__(self, say: Callable[[str], None] = lambda line: None):
        self.say = say
        self.prefix = run_prefix(os.getpid())
        self.places: Dict[str, Place] = {}
        self.cuts: Dict[str, Cut] = {}
        self.subnet: Optional[ipaddress.IPv4Network] = None
        self.state = NetworkState.NEW
        self._last_slot = FIRST_SLOT - 1
        self._lock_fd: Optional[int] = None

    def _set_state(self, new: NetworkState) -> None:
        log.debug("network %s: %s -> %s", self.prefix, self.state.value, new.value)
        self.state = new

    def _require(self, state: NetworkState) -> None:
        if self.state != state:
            raise NetworkError(f"network {self.prefix} is {self.state.value}, not {state.value}")

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    @property
    def uplink(self) -> str:
        return f"{self.prefix}h"

    @property
    def host_address(self) -> str:
        return str(self.subnet.network_address + 1)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "Network":
        """Hold the run's lock, remove what crashed runs left, make the hub. Raises
        :class:`NetworkError` (after removing what it made) when the kernel refuses."""
        self._require(NetworkState.NEW)
        os.makedirs(LOCK_DIR, exist_ok=True)
        self._lock_fd = os.open(self._lock_path(self.prefix), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)  # ours: our pid is alive, nobody else has it
        self.remove_stale()
        with self._global_lock():  # two runs starting together must not pick one subnet
            self.subnet = free_subnet(self._host_networks())
            try:
                self._ip("netns", "add", self.hub)
                self._ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
                self._ip("-n", self.hub, "link", "set", "br0", "up")
                self._ip("link", "add", self.uplink, "type", "veth", "peer", "name", "up0", "netns", self.hub)
                self._ip("-n", self.hub, "link", "set", "up0", "master", "br0", "up")
                self._ip("addr", "add", f"{self.host_address}/24", "dev", self.uplink)
                self._ip("link", "set", self.uplink, "up")
            except NetworkError:
                self.close()
                raise
        self._set_state(NetworkState.STARTED)
        self.say(f"network: hub {self.hub}, host address {self.host_address}/24 on {self.uplink}, "
                 f"namespaces {self.prefix}-*")
        return self

    def close(self) -> None:
        """Remove every place, the hub, the uplink and the lock (idempotent; never raises)."""
        if self.state == NetworkState.CLOSED:
            return
        self._set_state(NetworkState.CLOSED)
        for place in list(self.places.values()):
            with contextlib.suppress(NetworkError):
                self._remove_place(place)
        with contextlib.suppress(NetworkError):
            self._remove_all(self.prefix)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._lock_path(self.prefix))
            os.close(self._lock_fd)
            self._lock_fd = None

    def remove_stale(self) -> List[str]:
        """Remove the namespaces and links of runs whose lock nobody holds; their prefixes."""
        names = self._namespaces() + self._links()
        removed = []
        for prefix in sorted(prefixes_in(names)):
            if prefix == self.prefix:  # an earlier process with our pid: long dead
                self._remove_all(prefix)
                removed.append(prefix)
                continue
            fd = os.open(self._lock_path(prefix), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live run's
                self._remove_all(prefix)
                removed.append(prefix)
                with contextlib.suppress(OSError):
                    os.unlink(self._lock_path(prefix))
            finally:
                os.close(fd)
        if removed:
            self.say(f"network: removed what earlier runs left ({', '.join(removed)})")
        return removed

    # ---------------------------------------------------------------- places

    def add(self, label: str) -> Place:
        """A new namespace joined to the hub's bridge. Addresses are handed out in turn (the next
        free one after the last), so a just-freed one is not taken again at once."""
        self._require(NetworkState.STARTED)
        if label in self.places or label == "hub":
            raise NetworkError(f"place {label} exists")
        slot = next_slot(self._last_slot, {p.slot for p in self.places.values()})
        self._last_slot = slot
        place = Place(label, f"{self.prefix}-{label}", slot, str(self.subnet.network_address + slot))
        self.places[label] = place
        try:
            self._ip("netns", "add", place.namespace)
            self._ip("-n", self.hub, "link", "add", place.hub_link, "type", "veth", "peer", "name", "eth0",
                     "netns", place.namespace)
            self._ip("-n", self.hub, "link", "set", place.hub_link, "master", "br0", "up")
            self._ip("-n", place.namespace, "addr", "add", f"{place.address}/24", "dev", "eth0")
            self._ip("-n", place.namespace, "link", "set", "eth0", "up")
            self._ip("-n", place.namespace, "link", "set", "lo", "up")
        except NetworkError:
            with contextlib.suppress(NetworkError):
                self._remove_place(place)
            raise
        return place

    def remove(self, place: Place) -> None:
        """Delete the place's veth pair, then its namespace (its rules go with it). Processes
        still in it are SIGKILLed first: a namespace outlives its name while anything runs inside."""
        self._require(NetworkState.STARTED)
        self._remove_place(place)

    def _remove_place(self, place: Place) -> None:
        self.places.pop(place.label, None)
        self.cuts.pop(place.label, None)
        self._ip("-n", self.hub, "link", "del", place.hub_link, check=False)
        self._remove_namespace(place.namespace)

    def expose_loopback(self, place: Place, ports: Sequence[int]) -> None:
        """Make ``ports`` of the place's loopback reachable at its address."""
        self._in(place, ["sysctl", "-qw", "net.ipv4.conf.eth0.route_localnet=1"])
        self._in(place, ["nft", "-f", "-"], loopback_rules(ports))

    # ---------------------------------------------------------------- faults

    def cut(self, place: Place, peers: Sequence[Place], port: Optional[int] = None, oneway: bool = False) -> None:
        self._require(NetworkState.STARTED)
        if place.label in self.cuts:
            raise NetworkError(f"{place.label} is cut already")
        self._in(place, ["nft", "-f", "-"], cut_rules([p.address for p in peers], port, oneway))
        self.cuts[place.label] = Cut(list(peers), port, oneway)
        how = "answers from" if oneway else "both ways from"
        self.say(f"network: cut {place.label} ({place.address}) {how} "
                 f"{', '.join(p.label for p in peers)}" + (f" port {port}" if port else ""))

    def is_cut(self, place: Place) -> bool:
        return place.label in self.cuts

    def heal(self, place: Place, reset: bool) -> None:
        """Delete the place's rules; with ``reset``, abort its TCP connections with the peers it
        was cut from, at both ends. A place removed meanwhile (its process died) is skipped."""
        self._require(NetworkState.STARTED)
        cut = self.cuts.pop(place.label, None)
        if cut is None or place.label not in self.places:
            return
        self._in(place, ["nft", "delete", "table", "inet", TABLE])
        if reset:
            for peer in cut.peers:
                self._in(place, ["ss", "-K", "-t", "dst", peer.address], check=False)
                if peer.label in self.places:
                    self._in(peer, ["ss", "-K", "-t", "dst", place.address], check=False)
        self.say(f"network: healed {place.label}" + (", its connections reset" if reset else ""))

    # ---------------------------------------------------------------- plumbing

    @staticmethod
    def _lock_path(prefix: str) -> str:
        return os.path.join(LOCK_DIR, f"{prefix}.lock")

    @contextlib.contextmanager
    def _global_lock(self):
        fd = os.open(os.path.join(LOCK_DIR, "subnets.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _remove_all(self, prefix: str) -> None:
        """The run's namespaces (the hub last: deleting it deletes the veths on its bridge) and its uplink."""
        names = [n for n in self._namespaces() if FAMILY.match(n) and n.startswith(prefix + "-")]
        for name in sorted(names, key=lambda n: n == f"{prefix}-hub"):
            self._remove_namespace(name)
        for name in self._links():
            if FAMILY.match(name) and name.startswith(prefix):
                self._ip("link", "del", name, check=False)

    def _remove_namespace(self, name: str) -> None:
        pids = self._run(["ip", "netns", "pids", name], check=False).split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        self._ip("netns", "del", name, check=False)

    def _namespaces(self) -> List[str]:
        return [line.split()[0] for line in self._run(["ip", "netns", "list"], check=False).splitlines() if line]

    def _links(self) -> List[str]:
        # "7: zc0001a2v3@if2: <...": the name ends at "@" or ":"
        return [re.split(r"[@:]", line.split(": ", 1)[1], 1)[0]
                for line in self._run(["ip", "-o", "link", "show"], check=False).splitlines() if ": " in line]

    def _host_networks(self) -> List[str]:
        out = self._run(["ip", "-o", "-4", "addr", "show"], check=False)
        return [fields[3] for fields in (line.split() for line in out.splitlines()) if len(fields) > 3]

    def _ip(self, *args: str, check: bool = True) -> str:
        return self._run(["ip", *args], check=check)

    def _in(self, place: Place, argv: List[str], stdin: Optional[str] = None, check: bool = True) -> str:
        return self._run(["ip", "netns", "exec", place.namespace, *argv], stdin, check)

    @staticmethod
    def _run(argv: List[str], stdin: Optional[str] = None, check: bool = True) -> str:
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NetworkError(f"{' '.join(argv)}: {e}") from None
        if check and done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise NetworkError(f"{' '.join(argv)}: {said[0] if said else f'exit status {done.returncode}'}")
        return done.stdout
