"""``coordinatord`` (:mod:`~coordinator.cli.coordinatord`), and :mod:`~coordinator.cli.common`:
the one-line-error commands and checked option types every zkgroups tool uses."""
