"""Faults: chaos rounds and their referee, the network of namespaces, coordinatord failover, end-to-end accounting."""
