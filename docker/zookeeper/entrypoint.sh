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
# TLS only (this image's own names): with ZOO_TLS_KEY_STORE set, the server has no plaintext
# client port at all, only a secureClientPort on Netty with client certificates required and
# mapped to x509 identities (X509AuthenticationProvider), Netty's jars on the classpath:
#   ZOO_TLS_KEY_STORE         PEM file with this server's key and certificate
#   ZOO_TLS_TRUST_STORE       PEM file of the CA(s) client certificates are checked against
#   ZOO_SECURE_CLIENT_PORT    2281 (ZOO_CLIENT_PORT is then not opened)
#   ZOO_TLS_CLIENT_AUTH       need (default: a client without a certificate is refused) or want
#   ZOO_TLS_QUORUM            true: the servers' own traffic (2888, 3888) over TLS too, with the
#                             same stores (sslQuorum; the peers' host names not checked, so any
#                             certificate of the trusted CA is let in); false (default): plaintext
# ZOO_SERVERS entries then carry no ";CLIENT_PORT" (that would open a plaintext port).
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

TLS_KEY_STORE="${ZOO_TLS_KEY_STORE:-}"
if [ -n "$TLS_KEY_STORE" ]; then
  integer ZOO_SECURE_CLIENT_PORT "${ZOO_SECURE_CLIENT_PORT:=2281}" 1 65535
  case "${ZOO_TLS_CLIENT_AUTH:=need}" in need|want) ;; *) die "ZOO_TLS_CLIENT_AUTH must be need or want" ;; esac
  case "${ZOO_TLS_QUORUM:=false}" in true|false) ;; *) die "ZOO_TLS_QUORUM must be true or false" ;; esac
  [ -n "${ZOO_TLS_TRUST_STORE:-}" ] || die "ZOO_TLS_KEY_STORE needs ZOO_TLS_TRUST_STORE (the CA client certificates are checked against)"
  for store in "$TLS_KEY_STORE" "$ZOO_TLS_TRUST_STORE"; do
    [ -r "$store" ] || die "$store does not exist or is not readable by $(id -un) (uid $(id -u))"
  done
  grep -q -- "-----BEGIN CERTIFICATE-----" "$TLS_KEY_STORE" && grep -q -- "PRIVATE KEY-----" "$TLS_KEY_STORE" \
    || die "ZOO_TLS_KEY_STORE $TLS_KEY_STORE must hold this server's PEM key and certificate"
  grep -q -- "-----BEGIN CERTIFICATE-----" "$ZOO_TLS_TRUST_STORE" || die "ZOO_TLS_TRUST_STORE $ZOO_TLS_TRUST_STORE holds no PEM certificate"
fi

read -r -a SERVERS <<<"${ZOO_SERVERS:-}"
own=0
for entry in "${SERVERS[@]}"; do
  [[ "$entry" =~ ^server\.([0-9]+)=[A-Za-z0-9._-]+:[0-9]+:[0-9]+(:(participant|observer))?(\;([^;:]+:)?[0-9]+)?$ ]] \
    || die "ZOO_SERVERS entry '$entry' is not server.N=HOST:QUORUM_PORT:ELECTION_PORT[;CLIENT_PORT]"
  [ "${BASH_REMATCH[1]}" != "$MY_ID" ] || own=1
  [ -z "$TLS_KEY_STORE" ] || [ -z "${BASH_REMATCH[4]}" ] \
    || die "ZOO_SERVERS entry '$entry' names a client port, which would be plaintext: leave out ';${BASH_REMATCH[4]#;}' with ZOO_TLS_KEY_STORE"
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
    if [ -n "$TLS_KEY_STORE" ]; then  # no clientPort line: a plaintext client finds nothing to talk to
      echo "secureClientPort=$ZOO_SECURE_CLIENT_PORT"
      echo "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory"
      echo "ssl.keyStore.location=$TLS_KEY_STORE"
      echo "ssl.keyStore.type=PEM"
      echo "ssl.trustStore.location=$ZOO_TLS_TRUST_STORE"
      echo "ssl.trustStore.type=PEM"
      echo "ssl.clientAuth=$ZOO_TLS_CLIENT_AUTH"
      # Clients' certificates name identities, not hosts: no check of the client's host name.
      echo "ssl.hostnameVerification=false"
      echo "authProvider.x509=org.apache.zookeeper.server.auth.X509AuthenticationProvider"
      if [ "$ZOO_TLS_QUORUM" = true ]; then
        echo "sslQuorum=true"
        echo "ssl.quorum.keyStore.location=$TLS_KEY_STORE"
        echo "ssl.quorum.keyStore.type=PEM"
        echo "ssl.quorum.trustStore.location=$ZOO_TLS_TRUST_STORE"
        echo "ssl.quorum.trustStore.type=PEM"
        # A peer's connection comes from an address whose reverse name (a container's) is not
        # the one its certificate carries: the CA is the check, not the name.
        echo "ssl.quorum.hostnameVerification=false"
      fi
    else
      echo "clientPort=$ZOO_CLIENT_PORT"
    fi
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
ZK_CLASSPATH=/usr/share/zookeeper-image:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar
if [ -n "$TLS_KEY_STORE" ]; then
  # Netty's jars: zookeeper.jar's manifest leaves some out, and without netty-codec every
  # handshake fails (NoClassDefFoundError: io/netty/handler/codec/ByteToMessageDecoder).
  for jar in codec handler buffer common transport resolver transport-native-unix-common transport-native-epoll; do
    [ ! -f "/usr/share/java/netty-$jar.jar" ] || ZK_CLASSPATH="$ZK_CLASSPATH:/usr/share/java/netty-$jar.jar"
  done
  [[ "$ZK_CLASSPATH" == *netty-codec.jar* ]] || die "no /usr/share/java/netty-codec.jar: TLS needs Debian's libnetty-java"
fi
# Debian's zookeeper.jar names no logging backend (slf4j would log nothing): log4j 1.2 through
# slf4j-log4j12, both installed with it, writing to standard output (log4j.properties).
exec java "${JVM[@]}" -XX:+ExitOnOutOfMemoryError \
  -Dzookeeper.root.logger="$ZOO_LOG_LEVEL,CONSOLE" -Dzookeeper.log.dir=/var/lib/zookeeper \
  -cp "$ZK_CLASSPATH" \
  org.apache.zookeeper.server.quorum.QuorumPeerMain "$CFG"
