"""The operator console a coordinator node serves beside its metrics (``coordinatord --http-addr``).

* :mod:`~coordinator.console.share_snapshot` — the share groups the pages show, read whole
  when they change (at most once a second a group).
* :mod:`~coordinator.console.snapshot` — what the pages show (groups, share groups, the
  coordinator, topics), in memory, kept current by ZooKeeper watches (never a read per page view).
* :mod:`~coordinator.console.lag` — committed offsets against the data plane's log ends, read
  on an interval, with a short history per partition and catch-up estimates.
* :mod:`~coordinator.console.app` — the routes: the JSON API (``/api/v1``, the documents of
  ``groupctl --output json`` and the rebalance timeline) and the server-rendered pages (``/ui``).

The HTTP server itself (routing, ``/metrics``, ``/healthz``, ``/readyz``, who may see the
console, TLS) is :mod:`coordinator.http`; the rebalance timeline the pages show is written by
:mod:`coordinator.timeline`. Everything here only reads.
"""
from coordinator.console.app import Console
from coordinator.console.lag import LagSampler, LogEnds
from coordinator.console.snapshot import ClusterSnapshot

__all__ = ["Console", "ClusterSnapshot", "LagSampler", "LogEnds"]
