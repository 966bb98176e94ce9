"""The client-side tools: ``groupctl`` (:mod:`~consumer.cli.groupctl`: topics, produce;
:mod:`~consumer.cli.groups`: coordinator, groups; :mod:`~consumer.cli.consume`: consume;
:mod:`~consumer.cli.describe`: the
views of ``groups describe``; :mod:`~consumer.cli.reset`: planning ``groups reset-offsets``;
:mod:`~consumer.cli.share`: share-groups; :mod:`~consumer.cli.share_consume`: share-consume),
``pipeline`` (:mod:`~consumer.cli.pipeline`: a topic to Parquet through a group on Spark) and
the live demo (:mod:`~consumer.cli.demo`), and ``coordinatord``'s entry point
(:mod:`~consumer.cli.coordinatord`: the node with the data plane for its console). :mod:`~consumer.cli.context` holds their shared
options; :mod:`coordinator.cli.common` their one-line error handling, logging and output."""
