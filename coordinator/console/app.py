"""The console's routes: the JSON API (``/api/v1``) and the pages (``/ui``), read-only.

The API answers the documents ``groupctl ... --output json`` prints, built by the same
functions (:mod:`coordinator.documents`) from the node's :class:`ClusterSnapshot` and its
:class:`LagSampler`'s last reading, plus the rebalance timeline:

==================================  ==============================================================
``/api/v1/coordinator``             ``groupctl coordinator``
``/api/v1/groups``                  ``groupctl groups list`` (``?q=&state=&sort=&order=&limit=&offset=``
                                    filter and page it, adding ``total``)
``/api/v1/groups/G``                ``groupctl groups describe G --state``
``/api/v1/groups/G/members``        ``groupctl groups describe G --members``
``/api/v1/groups/G/offsets``        ``groupctl groups describe G`` (as of the last lag reading)
``/api/v1/groups/G/timeline``       ``{"group", "capacity", "timeline": [entry, ...]}``, oldest first
``/api/v1/topics``                  ``groupctl topics list``
``/api/v1/topics/T``                ``groupctl topics describe T`` (as of the last lag reading)
``/api/v1/share-groups``            ``groupctl share-groups list``: each share group in one row
                                    (:func:`~coordinator.documents.share_group_row`)
``/api/v1/share-groups/G``          ``groupctl share-groups describe G --output json``
                                    (:func:`~coordinator.documents.share_group_document`)
``/api/v1/openapi.json``            the API's OpenAPI 3.1 document (``static/openapi.json``)
==================================  ==============================================================

The pages are rendered on the server by Jinja2 with autoescaping on: every name, id, host and
error comes from ZooKeeper and is written by consumers, so it is text, never markup. The one
script (``/static/console.js``) fetches the same page again every few seconds and swaps the
parts marked ``data-live`` with the server's; it never builds HTML from data. Nothing here
writes anything; where an operator would act, the page shows the ``groupctl`` command.

Share groups (``/ui/share-groups``, ``/ui/share-groups/G``) come from the snapshot, which
reads each one whole when it changes; their log ends (for lag) are those of the last lag
reading's topics (:attr:`LagSampler.reading`), so nothing is read per request there either.
"""
from __future__ import annotations

import datetime as dt
import os
import shlex
import time
from typing import Dict, List, Optional, Tuple
from urllib.parse import parse_qs, quote, unquote

import jinja2
from prometheus_client.core import GaugeMetricFamily

from coordinator import documents, lagtime, protocol
from coordinator.console.lag import DEFAULT_INTERVAL_S, LagSampler, LogEnds, catch_up, sparkline
from coordinator.console.snapshot import ClusterSnapshot, GroupView
from coordinator.protocol.share import SETTINGS as SHARE_SETTINGS
from coordinator.http import Response

HERE = os.path.dirname(os.path.abspath(__file__))
STATIC = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8",
          "favicon.svg": "image/svg+xml", "openapi.json": "application/json"}
PAGE_SIZES = (25, 50, 100, 500)
SORTS = ("name", "state", "generation", "members", "lag", "last", "coordinator")
STATES = (protocol.EMPTY, protocol.REBALANCING, protocol.STABLE, protocol.FAILED, "unreadable")
#: How often pages refresh their live parts (the script reads it from the page).
REFRESH_S = 3


def _age(ms: Optional[float], now: float) -> str:
    if not ms:
        return "-"
    seconds = max(0.0, now - ms / 1000.0)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} d ago"


def _when(ms: Optional[float]) -> str:
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000.0, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _number(value) -> str:
    return "-" if value is None else f"{value:,}"


class Console:
    """The console of one node: ``route(path, query)`` answers a request (HTTP threads)."""

    def __init__(self, snapshot: ClusterSnapshot, sampler: LagSampler, node_id: str, connection=lambda: "CONNECTED"):
        self.snapshot, self.sampler, self.node_id, self.connection = snapshot, sampler, node_id, connection
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
                                      autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                                      lstrip_blocks=True)
        self.env.filters.update(segment=lambda s: quote(str(s), safe=""), number=_number, when=_when,
                                shell=lambda s: shlex.quote(str(s)), duration=_duration)
        self._static = {}
        for name in STATIC:
            with open(os.path.join(HERE, "static", name), "rb") as f:
                self._static[name] = f.read()
        self._rows_cache: Tuple[tuple, List[dict]] = ((), [])
        self._list_cache: Tuple[Optional[List[dict]], bytes] = (None, b"")
        self._shards: Tuple[Optional[int], Dict[str, int]] = (None, {})   # (shard count, group -> shard)
        self._share_ends: Tuple[Optional[float], Dict[Tuple[str, int], int]] = (None, {})

    # ------------------------------------------------------------ routing

    def route(self, path: str, query: str) -> Optional[Response]:
        params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        parts = [unquote(p) for p in path.split("/")[1:]]
        if parts == ["favicon.ico"]:
            return Response.redirect("/static/favicon.svg")
        if parts[:1] == ["static"] and len(parts) == 2 and parts[1] in STATIC:
            return Response(200, self._static[parts[1]], STATIC[parts[1]])
        if parts[:2] == ["api", "v1"]:
            return self._api(parts[2:], params)
        if parts[:1] == ["ui"]:
            return self._page(parts[1:], params)
        return None

    # ------------------------------------------------------------ shared

    def _coordinator_of(self) -> Dict[str, Optional[str]]:
        """group -> the node leading its shard (None: nobody)."""
        _, _, _, count, _ = self.snapshot.coordinator()
        if not count:
            return {}
        leaders = {shard: node or None for shard, (node, _, _) in self.snapshot.shard_leaders().items()}
        cached_count, shards = self._shards
        if cached_count != count:
            shards = {}
            self._shards = (count, shards)
        out = {}
        for g in self.snapshot.groups():
            shard = shards.get(g)
            if shard is None:
                shard = shards[g] = protocol.shard_of(g, count)  # a group's shard never changes
            out[g] = leaders.get(shard)
        return out

    def _coordinator(self, group: str) -> Optional[str]:
        """The node leading ``group``'s shard (None: nobody)."""
        _, _, _, count, _ = self.snapshot.coordinator()
        if not count:
            return None
        return self.snapshot.shard_leaders().get(protocol.shard_of(group, count), ("",))[0] or None

    def _group_rows(self) -> List[dict]:
        """One row per group for the groups page and ``/api/v1/groups``' filters (cached until
        the snapshot or the lag reading changes)."""
        reading = self.sampler.reading()
        key = (self.snapshot.version, reading.at)
        cached_key, rows = self._rows_cache
        if cached_key == key:
            return rows
        coordinators = self._coordinator_of()
        lags = reading.total_lag
        rows = []
        for name, view in sorted(self.snapshot.groups().items()):
            s = view.state
            rows.append({"group": name, "state": s.state if s else "unreadable", "generation": s.generation if s else None,
                         "members": len(view.ids) if s else None, "strategy": (s.strategy or None) if s else None,
                         "lag": lags.get(name), "last": view.last_rebalance_ms,
                         "coordinator": coordinators.get(name), "error": view.state_error or (s.error if s else None),
                         "list_row": documents.list_row(name, s, len(view.ids), view.state_error)})
        self._rows_cache = (key, rows)
        return rows

    def _select(self, params: Dict[str, str]) -> Tuple[List[dict], int, dict]:
        """The group rows matching ``q`` and ``state``, sorted, and the whole count."""
        q, state = params.get("q", "").strip().lower(), params.get("state", "")
        sort = params.get("sort", "name") if params.get("sort") in SORTS else "name"
        descending = params.get("order", "desc" if sort in ("lag", "last") else "asc") == "desc"
        rows = [r for r in self._group_rows() if (not q or q in r["group"].lower()) and (not state or r["state"] == state)]
        if sort != "name":
            present = [r for r in rows if r[sort] is not None]
            missing = [r for r in rows if r[sort] is None]
            present.sort(key=lambda r: (r[sort], r["group"]), reverse=descending)
            rows = present + missing
        elif descending:
            rows = rows[::-1]
        return rows, len(rows), {"q": params.get("q", ""), "state": state, "sort": sort,
                                 "order": "desc" if descending else "asc"}

    def _offsets(self, view: GroupView) -> Optional[List[dict]]:
        """The group's offsets rows: offsets and log ends as of the last lag reading, owners as
        the snapshot says now (a rebalance since the reading shows at once, as groupctl would)."""
        rows = self.sampler.reading().rows.get(view.name)
        if rows is None or view.state is None:
            return rows
        snapshot = self._describe(view.name)
        pairs = [(r["topic"], r["partition"]) for r in rows]
        shaped = documents.offsets_rows(snapshot, pairs, {pair: r["current_offset"] for pair, r in zip(pairs, rows)},
                                        {pair: r["error"] for pair, r in zip(pairs, rows) if r["error"]},
                                        {pair: r["log_end_offset"] for pair, r in zip(pairs, rows)
                                         if r["log_end_offset"] is not None})
        for new, old in zip(shaped, rows):  # ages as of the reading, as its offsets are
            new.update({name: old[name] for name in lagtime.FIELDS})
        return shaped

    def _describe(self, name: str) -> documents.GroupSnapshot:
        view = self.snapshot.group(name)
        return documents.GroupSnapshot(name, view.state, dict(view.members), dict(view.unreadable))

    # ------------------------------------------------------------ the API

    def _api(self, parts: List[str], params: Dict[str, str]) -> Response:
        if parts in ([], [""]):
            return Response.json({"endpoints": ["/api/v1/coordinator", "/api/v1/groups", "/api/v1/groups/{group}",
                                                "/api/v1/groups/{group}/members", "/api/v1/groups/{group}/offsets",
                                                "/api/v1/groups/{group}/timeline", "/api/v1/topics",
                                                "/api/v1/topics/{topic}", "/api/v1/share-groups",
                                                "/api/v1/share-groups/{group}", "/api/v1/openapi.json"]})
        if parts == ["openapi.json"]:
            return Response(200, self._static["openapi.json"], STATIC["openapi.json"])
        if parts == ["coordinator"]:
            return Response.json(self._coordinator_document())
        if parts == ["groups"]:
            if not any(k in params for k in ("q", "state", "sort", "order", "limit", "offset")):
                return self._all_groups()
            rows, total, _ = self._select(params)
            offset, limit = _int(params.get("offset"), 0), _int(params.get("limit"), total)
            return Response.json({"groups": [r["list_row"] for r in rows[offset:offset + limit]], "total": total})
        if parts[:1] == ["groups"] and len(parts) in (2, 3):
            view = self.snapshot.group(parts[1])
            if view is None:
                return Response.json({"error": f"group {parts[1]!r} does not exist"}, 404)
            if view.state is None:
                return Response.json({"error": f"group {parts[1]!r}: {view.state_error}"}, 500)
            what = parts[2] if len(parts) == 3 else "state"
            if what == "state":
                return Response.json({"groups": [documents.state_row(self._describe(view.name),
                                                                      self._coordinator(view.name))]})
            if what == "members":
                return Response.json({"members": documents.members_rows(self._describe(view.name))})
            if what == "offsets":
                rows = self._offsets(view)
                if rows is None:
                    return Response.json({"error": "lag not read yet; try again shortly"}, 503)
                return Response.json({"offsets": rows})
            if what == "timeline":
                return Response.json({"group": view.name, "capacity": protocol.TIMELINE_ENTRIES,
                                      "timeline": [e.encode() for e in view.timeline]})
        if parts == ["topics"]:
            return Response.json({"topics": self._topic_rows()})
        if parts == ["share-groups"]:
            return Response.json({"share_groups": [documents.share_group_row(v) for v in self._share_views()]})
        if parts[:1] == ["share-groups"] and len(parts) == 2:
            view = self.snapshot.share_group(parts[1])
            if view is None:
                return Response.json({"error": f"share group {parts[1]!r} does not exist"}, 404)
            return Response.json(documents.share_group_document(view, self._share_log_ends()))
        if parts[:1] == ["topics"] and len(parts) == 2:
            reading = self.sampler.reading()
            rows = reading.topics.get(parts[1])
            if rows is None:
                return Response.json({"error": f"topic {parts[1]!r} is not known (yet) to {reading.data_plane or 'the data plane'}"}, 404)
            return Response.json({"topic": parts[1], "data_plane": reading.data_plane, "partitions": rows})
        return Response.json({"error": "no such endpoint (see /api/v1/)"}, 404)

    def _all_groups(self) -> Response:
        """``groups list``'s document, serialized once per change (compact: 10,000 groups are
        about 1 MB of JSON)."""
        rows = self._group_rows()
        cached_rows, body = self._list_cache
        if cached_rows is not rows:
            body = Response.json({"groups": [r["list_row"] for r in rows]}, compact=True).body
            self._list_cache = (rows, body)
        return Response(200, body, "application/json; charset=utf-8")

    def _coordinator_document(self) -> dict:
        leader, contenders, nodes, count, _ = self.snapshot.coordinator()
        leaders = self.snapshot.shard_leaders()
        verified = bool(leaders) and all(node and ok for node, _, ok in leaders.values())
        shards = documents.shard_rows(count, leaders, self.snapshot.groups())
        return documents.coordinator_document(leader, verified, contenders, nodes, shards)

    def _share_log_ends(self) -> Dict[Tuple[str, int], int]:
        """{(topic, partition): log end} of the last lag reading (the lag reader's ends, every
        topic of the data plane; cached per reading)."""
        reading = self.sampler.reading()
        at, ends = self._share_ends
        if at != reading.at:
            ends = {(topic, row["partition"]): row["latest"] for topic, rows in reading.topics.items()
                    for row in rows if row.get("latest") is not None}
            self._share_ends = (reading.at, ends)
        return ends

    def _share_views(self) -> list:
        """The share groups read so far, by name (one listed a moment ago may not be read yet)."""
        return [view for _, view in sorted(self.snapshot.share_groups().items()) if view is not None]

    def _topic_rows(self) -> List[dict]:
        reading = self.sampler.reading()
        if reading.data_plane == "kafka":
            return [documents.topic_row(t, n) for t, n in sorted(reading.counts.items())]
        counts, errors = self.snapshot.topics()
        return [documents.topic_row(t, counts[t], errors.get(t)) for t in sorted(counts)]

    # ------------------------------------------------------------ the pages

    def _render(self, template: str, status: int = 200, **context) -> Response:
        reading = self.sampler.reading()
        context.setdefault("page", "")
        context.update(node_id=self.node_id, connection=self.connection(), snapshot_state=self.snapshot.state.value,
                       lag_at=_when(reading.at * 1000) if reading.at else "not yet", refresh_s=REFRESH_S,
                       lag_error=self.sampler.last_error)
        return Response.html(self.env.get_template(template).render(**context), status)

    def _page(self, parts: List[str], params: Dict[str, str]) -> Response:
        if parts in ([], [""]):
            return self._overview()
        if parts == ["groups"]:
            return self._groups(params)
        if parts[:1] == ["groups"] and len(parts) == 2:
            view = self.snapshot.group(parts[1])
            if view is None:
                return self._render("missing.html", 404, what="group", name=parts[1])
            return self._group(view)
        if parts == ["topics"]:
            return self._render("topics.html", topics=self._topic_rows(), page="topics")
        if parts == ["share-groups"]:
            return self._share_groups()
        if parts[:1] == ["share-groups"] and len(parts) == 2:
            view = self.snapshot.share_group(parts[1])
            if view is None:
                return self._render("missing.html", 404, what="share group", name=parts[1])
            return self._share_group(view)
        if parts[:1] == ["topics"] and len(parts) == 2:
            return self._topic(parts[1])
        return self._render("missing.html", 404, what="page", name="/ui/" + "/".join(parts))

    def _overview(self) -> Response:
        document = self._coordinator_document()
        rows = self._group_rows()
        by_node: Dict[str, dict] = {}
        for shard in document["shards"]:
            entry = by_node.setdefault(shard["node"] or "", {"shards": 0, "groups": 0, "verified": True})
            entry["shards"] += 1
            entry["groups"] += len(shard["groups"])
            entry["verified"] &= bool(shard["verified"])
        _, _, nodes, _, _ = self.snapshot.coordinator()
        counts = {s: sum(1 for r in rows if r["state"] == s) for s in STATES}
        lags = [r["lag"] for r in rows if r["lag"] is not None]
        return self._render("overview.html", page="overview", document=document, nodes=nodes, by_node=by_node,
                            counts=counts, groups=len(rows), total_lag=sum(lags) if lags else None,
                            failed=[r for r in rows if r["state"] == protocol.FAILED][:20], now=time.time())

    def _groups(self, params: Dict[str, str]) -> Response:
        rows, total, chosen = self._select(params)
        size = _int(params.get("size"), 50)
        size = size if size in PAGE_SIZES else 50
        pages = max(1, (total + size - 1) // size)
        number = min(max(1, _int(params.get("page"), 1)), pages)
        shown = rows[(number - 1) * size:number * size]
        now = time.time()
        for row in shown:
            row["age"] = _age(row["last"], now)
        return self._render("groups.html", page="groups", rows=shown, total=total, all_groups=len(self._group_rows()),
                            number=number, pages=pages, size=size, sizes=PAGE_SIZES, states=STATES, sorts=SORTS,
                            chosen=chosen)

    def _group(self, view: GroupView) -> Response:
        now = time.time()
        reading = self.sampler.reading()
        coordinator = self._coordinator(view.name)
        members = documents.members_rows(self._describe(view.name)) if view.state else []
        for row in members:
            reg = view.members.get(row["consumer_id"])
            row["instance"] = reg.group_instance_id if reg else None
        partitions = []
        for row in self._offsets(view) or []:
            times, committed, ends = self.sampler.history.series(view.name, row["topic"], row["partition"])
            lags = [None if c is None or e is None else e - c for c, e in zip(committed, ends)]
            estimate = catch_up(times, committed, ends)
            partitions.append({**row, "chart": sparkline(lags), "catch_up": estimate,
                               "eta": _duration(estimate.eta_s) if estimate.eta_s else ""})
        held = []
        if view.state:
            for cid, member in sorted(view.state.static.items()):
                if member.away_since is not None:
                    held.append({"consumer_id": cid, "instance": member.instance_id, "since": _when(member.away_since),
                                 "until": _when(member.away_since + member.grace_ms)})
        lags = [r["lag"] for r in partitions if r["lag"] is not None]
        timeline = [{"entry": e, "when": _when(e.at), "age": _age(e.at, now)} for e in reversed(view.timeline)]
        return self._render("group.html", page="groups", view=view, state=view.state, coordinator=coordinator,
                            members=members, partitions=partitions, held=held, timeline=timeline,
                            total_lag=sum(lags) if lags else None, capacity=protocol.TIMELINE_ENTRIES,
                            max_lag_s=reading.max_lag_s.get(view.name),
                            last=_age(view.last_rebalance_ms, now), lag_read=view.name in reading.rows)

    def _share_groups(self) -> Response:
        ends = self._share_log_ends()
        rows = []
        for view in self._share_views():
            partitions = documents.share_partition_rows(view, ends)
            lags = [r["lag"] for r in partitions if r["lag"] is not None]
            rows.append({**documents.share_group_row(view), "coordinator": self._coordinator(view.name),
                         "lag": sum(lags) if lags else None,
                         **{k: sum(r[k] for r in partitions) for k in ("acquired", "delayed", "archived_pending")}})
        return self._render("share_groups.html", page="share-groups", rows=rows)

    def _share_group(self, view) -> Response:
        document = documents.share_group_document(view, self._share_log_ends())
        partitions = document["partitions"]
        lags = [r["lag"] for r in partitions if r["lag"] is not None]
        settings = [{"key": key, "value": value, "default": SHARE_SETTINGS[key].default,
                     "doc": SHARE_SETTINGS[key].doc} for key, value in document["settings"].items()]
        return self._render("share_group.html", page="share-groups", view=view, document=document,
                            partitions=partitions, members=document["members"], settings=settings,
                            coordinator=self._coordinator(view.name), total_lag=sum(lags) if lags else None,
                            in_flight=sum(r["in_flight"] for r in partitions),
                            acquired=sum(r["acquired"] for r in partitions),
                            archived_pending=sum(r["archived_pending"] for r in partitions))

    def _topic(self, topic: str) -> Response:
        reading = self.sampler.reading()
        counts, errors = self.snapshot.topics()
        rows = reading.topics.get(topic)
        if rows is None and topic not in counts:
            return self._render("missing.html", 404, what="topic", name=topic)
        readers = []
        for group, group_rows in sorted(reading.rows.items()):
            mine = [r for r in group_rows if r["topic"] == topic]
            if mine:
                lags = [r["lag"] for r in mine if r["lag"] is not None]
                readers.append({"group": group, "partitions": len(mine), "lag": sum(lags) if lags else None,
                                "owned": sum(1 for r in mine if r["consumer_id"])})
        return self._render("topic.html", page="topics", topic=topic, rows=rows or [], count=counts.get(topic),
                            error=errors.get(topic), readers=readers, data_plane=reading.data_plane)


def _int(value: Optional[str], default: int) -> int:
    try:
        return max(0, int(value)) if value not in (None, "") else default
    except ValueError:
        return default


class NodeConsole:
    """A node's console: its snapshot, lag sampler and routes (``app``), started and closed
    together. It adds its metrics to the node's registry (:class:`ConsoleCollector`)."""

    def __init__(self, node, ends: Optional[LogEnds], lag_interval_s: float = DEFAULT_INTERVAL_S):
        self.node = node
        self.snapshot = ClusterSnapshot(node.client)
        self.sampler = LagSampler(node.client, self.snapshot, ends, lag_interval_s)
        self.app = Console(self.snapshot, self.sampler, node.node_id, lambda: str(node.client.state))
        node.metrics.registry.register(ConsoleCollector(self))

    def start(self) -> "NodeConsole":
        self.snapshot.start()
        self.sampler.start()
        return self

    def close(self) -> None:
        self.sampler.close()
        self.snapshot.close()


class ConsoleCollector:
    """Metrics from the console's memory, for the groups this node leads (so that summing or
    taking the max over nodes counts each group once), read at scrape time:

    * ``zkgroups_group_total_lag`` {group}: the group's lag at the last reading (the name
      ``groupctl exporter`` serves too);
    * ``zkgroups_group_rebalancing_seconds`` {group}: how long the group's state has said
      Rebalancing (absent otherwise);
    * ``zkgroups_group_max_lag_seconds`` {group}: the age of the group's oldest unconsumed
      record at the last reading (:mod:`coordinator.lagtime`; absent while unknown);
    * ``zkgroups_group_max_estimated_lag_seconds`` {group}: its largest lag over its recent
      consumption rate (absent while the rate is unknown or 0);
    * ``zkgroups_console_lag_read_timestamp_seconds``: when lag was last read."""

    def __init__(self, console: NodeConsole):
        self.console = console

    def describe(self):
        return []

    def collect(self):
        groups = self.console.node.groups
        leads = groups.leads if groups is not None else (lambda _group: False)
        reading = self.console.sampler.reading()
        lag = GaugeMetricFamily("zkgroups_group_total_lag", "Sum of the group's lag.", labels=["group"])
        for group, value in sorted(reading.total_lag.items()):
            if value is not None and leads(group):
                lag.add_metric([group], value)
        ages = [_group_gauge(name, help_, values, leads) for name, help_, values in (
            ("zkgroups_group_max_lag_seconds", "Age of the group's oldest unconsumed record.", reading.max_lag_s),
            ("zkgroups_group_max_estimated_lag_seconds", "The group's largest lag over its recent consumption rate.",
             reading.max_estimated_lag_s))]
        rebalancing = GaugeMetricFamily("zkgroups_group_rebalancing_seconds",
                                        "How long the group's state has said Rebalancing.", labels=["group"])
        now = time.time()
        for name, view in sorted(self.console.snapshot.groups().items()):
            s = view.state
            if s is not None and s.state == protocol.REBALANCING and leads(name):
                rebalancing.add_metric([name], max(0.0, now - s.updated / 1000.0))
        when = GaugeMetricFamily("zkgroups_console_lag_read_timestamp_seconds", "When the console last read lag.")
        when.add_metric([], reading.at)
        return [lag, *ages, rebalancing, when]


def _group_gauge(name: str, help_: str, values: Dict[str, Optional[float]], leads) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, help_, labels=["group"])
    for group, value in sorted(values.items()):
        if value is not None and leads(group):
            gauge.add_metric([group], value)
    return gauge
