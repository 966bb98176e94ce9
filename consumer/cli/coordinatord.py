"""``coordinatord``: a coordinator node (:mod:`coordinator.cli.coordinatord`), its console reading
the data plane's log ends through :class:`~consumer.dataplane.log_ends.DataPlaneEnds` — the one
place where the node and the data plane meet, so that :mod:`coordinator` never imports
:mod:`consumer`."""
from __future__ import annotations

from consumer.dataplane.log_ends import DataPlaneEnds
from coordinator.cli import coordinatord as node_cli

#: The ``coordinatord`` command (the console script and ``python -m consumer.cli.coordinatord``).
main = node_cli.with_log_ends(DataPlaneEnds.open)

if __name__ == "__main__":
    main(prog_name="coordinatord")
