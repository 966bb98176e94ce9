"""The harness's free ports: outside the kernel's ephemeral range (a server down for a restart
keeps its port from outgoing connections), a slice per pytest-xdist worker, never one twice."""
from coordinator.testing import zkserver


def test_ports_are_below_the_ephemeral_range_and_never_handed_out_twice():
    ports = [zkserver.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    assert all(zkserver.PORT_RANGE[0] <= p < zkserver.PORT_RANGE[1] < ephemeral_low for p in ports)


def test_each_xdist_worker_has_a_slice_of_its_own(monkeypatch):
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        slices.append(zkserver._port_slice())
        low, high = slices[-1]
        assert low <= zkserver.free_port() < high
    assert all(a[1] <= b[0] for a, b in zip(slices, slices[1:]))
    assert slices[0][0] == zkserver.PORT_RANGE[0] and slices[-1][1] <= zkserver.PORT_RANGE[1]
