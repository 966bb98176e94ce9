"""Support shared by the tests, no tests of its own.

- ``helpers``: bounded waits on conditions, the tools run as processes, records filled and read.
- ``groups``: coordinators and members in one test's chroot (the ``cluster`` fixture), group state.
- ``browser``: headless Chromium for the console's browser tests.
- ``prometheus``: Debian's Prometheus server for a test, and the alert rules rendered for a fast clock.
- ``procs``: small programs the tests start as processes (``python -m tests.support.procs.member``).
"""
