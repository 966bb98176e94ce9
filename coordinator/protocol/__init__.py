"""The ZooKeeper contract of zkgroups: every path and every JSON schema, in one place (this package).

Both sides import it: the coordinator (election, rebalancing, topic registry) and the consumer
library (registration, command handling, owners, offsets). Nothing else builds a path or
parses a znode. Decoders raise :class:`~coordinator.errors.CorruptZnode` with the path and what
was wrong, so a znode written by someone else never takes down more than the thing it
describes. Every name is imported here too: ``protocol.GroupState``, ``protocol.state_path``.

Modules:

* :mod:`~coordinator.protocol.paths` — names and paths: where everything is.
* :mod:`~coordinator.protocol.codec` — the JSON rules every znode follows.
* :mod:`~coordinator.protocol.groups` — under ``/consumers/groups/<group>``: registrations,
  commands, the group state, the rebalance timeline, offsets.
* :mod:`~coordinator.protocol.cluster` — topics (Kafka's format), shards, nodes, the
  controller, the ACL policy.
* :mod:`~coordinator.protocol.spark` — what Spark workers record of their runs.
* :mod:`~coordinator.protocol.share` — under ``/consumers/share-groups/<group>``: a share
  group's settings, members and share-partition states.

Layout (documented in docs/concepts/zookeeper-layout.md)::

    /brokers/topics/<topic>                         {"version":1,"partitions":{"0":[0],...}} (Kafka's format;
                                                    versions 2 and 3 read too; mirrored ones marked)
    /brokers/ids/<broker id>                        only read: a Kafka in ZooKeeper mode is here
    /consumers/coordinator/election/<contenders>    kazoo Election of the controller (each watches its predecessor)
    /consumers/coordinator/leader                   ephemeral LeaderInfo of the controller
    /consumers/coordinator/epoch                    persistent; its znode version is the controller's epoch
    /consumers/coordinator/nodes/<node id>          ephemeral NodeInfo: a live coordinator node, its shards
    /consumers/coordinator/shards                   ShardsInfo: how many shards groups are spread over
    /consumers/coordinator/shards/<shard>           ShardAssignment: the node leading the shard, at which epoch
    /consumers/coordinator/shards/<shard>/epoch     its znode version is the shard's epoch (every write
                                                    of the shard's groups checks it)
    /consumers/coordinator/mirror-refresh           written to ask the controller's topic mirror to look now
    /consumers/groups/<group>/ids/<consumer-id>     ephemeral Registration (version 2: a static member,
                                                    consumer id <group>_static-<group instance id>)
    /consumers/groups/<group>/channel/<consumer-id>/cmd-<seq>   persistent sequential Command
    /consumers/groups/<group>/owners/<topic>/<partition>        ephemeral, data: stream id
    /consumers/groups/<group>/offsets/<topic>/<partition>       next offset, decimal (empty: none yet);
                                                    its znode version is the fencing token of claims
    /consumers/groups/<group>/completed/<topic>/<partition>     Completed: offsets a parallel consumer finished
                                                    above the committed one (written in the offset's
                                                    fenced transaction; valid while its base is the offset)
    /consumers/groups/<group>/state                 GroupState, written by the leader (its optional
                                                    ``static`` record keeps static members while away)
    /consumers/groups/<group>/timeline              Timeline: the group's last rebalances (a ring of at most
                                                    TIMELINE_ENTRIES), written by the leader after each one
    /consumers/share-groups/<group>                 ShareGroupConfig: the share group's settings
    /consumers/share-groups/<group>/members/<member id>          ephemeral ShareMember
    /consumers/share-groups/<group>/partitions/<topic>/<partition>  SharePartitionState: the window of
                                                    records in flight (written by members by compare-and-set,
                                                    by the group's coordinator fenced by its shard's epoch)
    /zkgroups-spark/stop/<run id>                   created to stop a streaming Spark job
    /consumers/acl                                  AclPolicy: the identities ACLs name (absent: open installation)
    /zkgroups-spark/runs/<run id>/workers/<consumer-id>   ephemeral: a Spark worker of the run is up
    /zkgroups-spark/runs/<run id>/flushed/<consumer-id>   ephemeral: it stopped, processed and committed
                                                    what it had (the stop barrier: members leave
                                                    once every live worker has flushed)
    /zkgroups-spark/runs/<run id>/progress/<consumer-id>  SparkProgress: what a worker attempt processed
                                                    (persistent: a killed attempt's stays until the run ends)
    /zkgroups-spark/runs/<run id>/errors/<consumer-id>    the Python error a worker attempt failed with,
                                                    one line of UTF-8 (the driver names it when the
                                                    attempt's death ends the job)
"""
from coordinator.protocol.codec import now_ms
from coordinator.protocol.paths import (BROKER_TOPICS, BROKER_IDS, COORDINATOR, ELECTION, LEADER, EPOCH, NODES,
                                        SHARDS, MIRROR_REFRESH, GROUPS, ACL_POLICY, SPARK_STOP, SPARK_RUNS,
                                        COMMAND_PREFIX, MAX_NAME_LENGTH, LEGAL_NAME, validate_name, topic_matcher,
                                        static_consumer_id, stream_id, consumer_of_stream, topic_path, group_path,
                                        ids_path, channel_path, command_prefix, command_path, command_sequence,
                                        owners_path, offsets_path, completed_path, state_path, timeline_path, node_path,
                                        shard_path,
                                        shard_epoch_path, shard_of, spark_stop_path, spark_run_path,
                                        spark_workers_path, spark_flushed_path, spark_progress_path,
                                        spark_errors_path)
from coordinator.protocol.groups import (PATTERN_STATIC, PATTERN_WHITE_LIST, PATTERN_BLACK_LIST, PATTERNS,
                                         STOP_FETCHER, START_FETCHER, EMPTY, REBALANCING, STABLE, FAILED,
                                         Registration, Ownership, Command, StaticMember, GroupState,
                                         TIMELINE_ENTRIES, TIMELINE_IDS, TIMELINE_MEMBERS, TIMELINE_OUTCOMES,
                                         RebalanceRecord, encode_timeline, decode_timeline, NO_OFFSET,
                                         encode_offset, decode_offset,
                                         MAX_COMPLETED_SPAN, encode_completed, decode_completed)
from coordinator.protocol.cluster import (MAX_SHARD_COUNT, MAX_PARTITIONS, MIRROR_MARK, TopicZnode, encode_topic,
                                          encode_mirrored_topic, decode_topic_znode, decode_topic, ShardsInfo,
                                          ShardAssignment, NodeInfo, LeaderInfo, AclPolicy)
from coordinator.protocol.share import (SHARE_GROUPS, ShareGroupConfig, ShareMember, SharePartitionState,
                                        share_group_path, share_members_path, share_partitions_path)
from coordinator.protocol.spark import (MAX_SPARK_ERROR_CHARS, encode_spark_error, decode_spark_error,
                                        SparkProgress, encode_spark_progress, decode_spark_progress)
