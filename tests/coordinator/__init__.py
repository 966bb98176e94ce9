"""The coordinator node against a real ZooKeeper: election, rebalances, shards, ACLs, topics, the mirror, scale."""
