#!/bin/bash
# Start one ZooKeeper server configured from the environment (names as in the official
# `zookeeper` image, so compose files and testcontainers code work with either image):
#
#   ZOO_MY_ID                 this server's id, 1-255 (default 1)
#   ZOO_SERVERS               the ensemble, space-separated: "server.1=zk1:2888:3888;2181 server.2=..."
#                             (empty: a standalone server)
#   ZOO_TICK_TIME             ms (2000); ZOO_INIT_LIMIT (10) and ZOO_SYNC_LIMIT (5) in ticks
#   ZOO_CLIENT_PORT           2181;  ZOO_MAX_CLIENT_CNXNS per client address (60)
#   ZOO_4LW_COMMANDS_WHITELIST four-letter words answered (ruok,srvr: what the health check uses)
#   ZOO_AUTOPURGE_PURGEINTERVAL hours between purges of old snapshots and logs (24; 0: never)
#   ZOO_AUTOPURGE_SNAPRETAINCOUNT snapshots kept (3)
#   ZOO_ADMINSERVER_ENABLED   the HTTP admin server on 8080 (false)
#   ZOO_CFG_EXTRA             more zoo.cfg lines, space-separated key=value
#   ZOO_LOG_LEVEL             INFO;  JVMFLAGS  more JVM options (a heap size: -Xmx512m)
#
# zoo.cfg is written to /etc/zookeeper at every start; a zoo.cfg mounted there without this
# script's header line is used as it is. With arguments, the arguments are run instead
# (docker run IMAGE bash).
set -euo pipefail

[ $# -eq 0 ] || exec "$@"

CONF_DIR=/etc/zookeeper
DATA_DIR=/var/lib/zookeeper/data
DATA_LOG_DIR=/var/lib/zookeeper/datalog
HEADER="# Written by zookeeper-entrypoint from the container's environment."

die() { echo "zookeeper-entrypoint: $*" >&2; exit 1; }
integer() {  # integer NAME VALUE MIN MAX
  [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] && [ "$2" -le "$4" ] \
    || die "$1 must be a whole number from $3 to $4, not '$2'"
}

MY_ID="${ZOO_MY_ID:-1}"
integer ZOO_MY_ID "$MY_ID" 1 255
integer ZOO_TICK_TIME "${ZOO_TICK_TIME:=2000}" 1 600000
integer ZOO_INIT_LIMIT "${ZOO_INIT_LIMIT:=10}" 1 1000
integer ZOO_SYNC_LIMIT "${ZOO_SYNC_LIMIT:=5}" 1 1000
integer ZOO_CLIENT_PORT "${ZOO_CLIENT_PORT:=2181}" 1 65535
integer ZOO_MAX_CLIENT_CNXNS "${ZOO_MAX_CLIENT_CNXNS:=60}" 0 100000
integer ZOO_AUTOPURGE_PURGEINTERVAL "${ZOO_AUTOPURGE_PURGEINTERVAL:=24}" 0 100000
integer ZOO_AUTOPURGE_SNAPRETAINCOUNT "${ZOO_AUTOPURGE_SNAPRETAINCOUNT:=3}" 3 100000
case "${ZOO_ADMINSERVER_ENABLED:=false}" in true|false) ;; *) die "ZOO_ADMINSERVER_ENABLED must be true or false" ;; esac
case "${ZOO_LOG_LEVEL:=INFO}" in TRACE|DEBUG|INFO|WARN|ERROR) ;; *) die "ZOO_LOG_LEVEL must be one of TRACE DEBUG INFO WARN ERROR" ;; esac

read -r -a SERVERS <<<"${ZOO_SERVERS:-}"
own=0
for entry in "${SERVERS[@]}"; do
  [[ "$entry" =~ ^server\.([0-9]+)=[A-Za-z0-9._-]+:[0-9]+:[0-9]+(:(participant|observer))?(\;([^;:]+:)?[0-9]+)?$ ]] \
    || die "ZOO_SERVERS entry '$entry' is not server.N=HOST:QUORUM_PORT:ELECTION_PORT[;CLIENT_PORT]"
  [ "${BASH_REMATCH[1]}" != "$MY_ID" ] || own=1
done
[ ${#SERVERS[@]} -eq 0 ] || [ "$own" = 1 ] || die "ZOO_SERVERS has no server.$MY_ID (this server's ZOO_MY_ID)"

mkdir -p "$DATA_DIR" "$DATA_LOG_DIR"
if [ -f "$DATA_DIR/myid" ]; then
  found="$(tr -d '[:space:]' <"$DATA_DIR/myid")"
  [ "$found" = "$MY_ID" ] || die "the data volume belongs to server $found, but ZOO_MY_ID is $MY_ID"
else
  echo "$MY_ID" >"$DATA_DIR/myid"
fi

CFG="$CONF_DIR/zoo.cfg"
if [ ! -f "$CFG" ] || head -n 1 "$CFG" | grep -qxF "$HEADER"; then
  {
    echo "$HEADER"
    echo "tickTime=$ZOO_TICK_TIME"
    echo "initLimit=$ZOO_INIT_LIMIT"
    echo "syncLimit=$ZOO_SYNC_LIMIT"
    echo "dataDir=$DATA_DIR"
    echo "dataLogDir=$DATA_LOG_DIR"
    echo "clientPort=$ZOO_CLIENT_PORT"
    echo "maxClientCnxns=$ZOO_MAX_CLIENT_CNXNS"
    echo "4lw.commands.whitelist=${ZOO_4LW_COMMANDS_WHITELIST:-ruok,srvr}"
    echo "autopurge.purgeInterval=$ZOO_AUTOPURGE_PURGEINTERVAL"
    echo "autopurge.snapRetainCount=$ZOO_AUTOPURGE_SNAPRETAINCOUNT"
    echo "admin.enableServer=$ZOO_ADMINSERVER_ENABLED"
    echo "standaloneEnabled=true"
    # Servers reach each other by service name; listening on all addresses keeps a restarted
    # container (new address) reachable without depending on what its own name resolves to.
    [ ${#SERVERS[@]} -eq 0 ] || echo "quorumListenOnAllIPs=true"
    for entry in "${SERVERS[@]}"; do echo "$entry"; done
    for extra in ${ZOO_CFG_EXTRA:-}; do echo "$extra"; done
  } >"$CFG.tmp"
  mv "$CFG.tmp" "$CFG"
fi

read -r -a JVM <<<"${JVMFLAGS:-}"
# Debian's zookeeper.jar names no logging backend (slf4j would log nothing): log4j 1.2 through
# slf4j-log4j12, both installed with it, writing to standard output (log4j.properties).
exec java "${JVM[@]}" -XX:+ExitOnOutOfMemoryError \
  -Dzookeeper.root.logger="$ZOO_LOG_LEVEL,CONSOLE" -Dzookeeper.log.dir=/var/lib/zookeeper \
  -cp /usr/share/zookeeper-image:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar \
  org.apache.zookeeper.server.quorum.QuorumPeerMain "$CFG"
