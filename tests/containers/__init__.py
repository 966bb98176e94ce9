"""``bin/test-containers``: the ``docker/`` deployment built, run and checked end to end.

* :mod:`tests.containers.run` — the engine, the base image, the builds, the testcontainers path,
  the Compose stack, its rounds with container kills and a rolling restart, the teardown.
"""
