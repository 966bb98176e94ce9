"""``coordinatord``: run one coordinator node. Any number run; one leads.

SIGTERM/SIGINT: the leader abandons its current attempt, resigns (another node leads at
once) and exits 0.
"""
from __future__ import annotations

import logging
import signal
import sys
import threading

import click

from coordinator import config as cfg
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.errors import ZkGroupsError
from coordinator.zkclient import DEFAULT_CONNECT

OPTION_KEYS = ("session_timeout_ms", "rebalance_timeout_ms", "max_rebalance_retries", "rebalance_backoff_ms",
               "failed_retry_interval_ms", "check_interval_ms")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--zk", envvar="ZK_CONNECT", default=DEFAULT_CONNECT, show_default=True,
              help="ZooKeeper connect string, optionally with a chroot (host:port/app).")
@click.option("--node-id", default=None, help="This node's id (default: host-pid).")
@click.option("--session-timeout-ms", type=int, help="ZooKeeper session timeout [6000].")
@click.option("--rebalance-timeout-ms", type=int, help="How long to wait for members' acks [30000].")
@click.option("--max-rebalance-retries", type=int, help="Retries before a group is Failed [4].")
@click.option("--rebalance-backoff-ms", type=int, help="Backoff between attempts, doubled each time [200].")
@click.option("--failed-retry-interval-ms", type=int, help="When a Failed group is tried again [30000].")
@click.option("--check-interval-ms", type=int, help="Periodic full check of every group [60000].")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML file with the options above ([coordinator] table or top level).")
def main(zk, node_id, log_level, config_file, **options):
    """Run a zkgroups coordinator node."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        values = {}
        if config_file:
            data = cfg.load_toml(config_file)
            values.update(data.get("coordinator", data))  # a [coordinator] table, or the top level
            zk = values.pop("zk", zk)
            node_id = values.pop("node_id", node_id)
        values.update({k: v for k, v in options.items() if v is not None})
        config = cfg.build(CoordinatorConfig, values, config_file or "options")
        node = Coordinator(zk, node_id, config).start()
    except ZkGroupsError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logging.getLogger("zkgroups.coordinator").info("node %s started (zk %s)", node.node_id, zk)
    while not stop.wait(0.5):
        pass
    node.close()


if __name__ == "__main__":
    main()
