"""Support shared by the tests, no tests of its own.

- ``helpers``: bounded waits on conditions, the tools run as processes, records filled and read.
- ``groups``: coordinators and members in one test's chroot (the ``cluster`` fixture), group state.
- ``consumers``: consumers in a test (the ``make_consumer`` and ``own_zookeeper`` fixtures), polling helpers.
- ``fakes``: a clock a test moves, an async answer: for pure-logic tests of runtime modules.
- ``members``: a member driven by hand: the leader played by a test (``ActingLeader``), what a client sends.
- ``browser``: headless Chromium for the console's browser tests.
- ``prometheus``: Debian's Prometheus server for a test, and the alert rules rendered for a fast clock.
- ``procs``: small programs the tests start as processes (``python -m tests.support.procs.member``).
"""
