"""The one thing setup.cfg cannot say: the optional C accelerator of reading from Kafka
(consumer/_speedups.c). Where it does not compile (no C compiler or no Python headers) the
install goes on without it and consumer.records uses its pure-Python equivalents."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("consumer._speedups", ["consumer/_speedups.c"], optional=True)])
