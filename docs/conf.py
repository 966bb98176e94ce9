"""Sphinx configuration of the zkgroups documentation.

Built offline and strictly: ``sphinx-build -W --keep-going -n docs docs/_build/html``
(``tests/project/test_docs.py`` runs exactly that, in a virtualenv holding only the package's
dependencies and its ``docs`` extra, as Read the Docs builds it: ``.readthedocs.yaml``). No intersphinx and no link checks: every
cross-reference must resolve inside this site, and ``nitpick_ignore_regex`` below names the
only targets that cannot (types of the standard library and of third-party packages).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(HERE, "_ext")]

from coordinator import __version__  # noqa: E402  (after the path is set)

project = "zkgroups"
author = "the zkgroups authors"
copyright = "the zkgroups authors; Apache License 2.0"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_click",
    "zkgroups_sphinx",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
root_doc = "index"

# MyST: headings get anchors for links such as [the lease](../concepts/fencing.md#the-lease).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
smartquotes = False  # "--zk" stays two dashes, quotes stay straight: text here is copied into shells
suppress_warnings = []

# autodoc: the API reference is the docstrings; members in source order, signatures with types.
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
autodoc_typehints = "signature"
autodoc_preserve_defaults = False
autodoc_inherit_docstrings = False  # pyspark's and click's docstrings are theirs to document
# The docs extra has no pyspark (300 MB, and a JVM to run it), and Read the Docs installs only
# that extra: the Spark data source (consumer/spark/source.py) is documented against a stand-in
# of pyspark, here as there, so that every build renders the same page.
autodoc_mock_imports = ["pyspark"]
napoleon_google_docstring = True
napoleon_numpy_docstring = True

# Nitpicky mode (-n): every reference must resolve. Types of the standard library and of
# third-party packages have no target here (no intersphinx: the build is offline).
nitpicky = True
_EXTERNAL = r"(typing|collections|abc|threading|queue|concurrent|socket|select|enum|dataclasses|datetime|io|os|re" \
            r"|array|subprocess|pathlib|logging|json|contextlib|types|http|random|signal|selectors|weakref|functools|ssl" \
            r"|kazoo|click|tenacity|re2|prometheus_client|confluent_kafka|pyspark|pyarrow|py4j|tomllib|tomli)"
nitpick_ignore_regex = [
    (r"py:.*", _EXTERNAL + r"(\..*)?"),
    (r"py:(class|obj)", r"(.*\.)?[A-Z]"),  # type variables (a Generic base names its own as py:obj)
    (r"py:class", r"(Context|Callable|Iterable|Iterator|Mapping|Sequence|Optional|Union|Any|BinaryIO|IO|TextIO"
                  r"|Type|Tuple|List|Dict|Set|FrozenSet|Deque|NamedTuple|Enum|IntEnum|Exception|BaseException"
                  r"|KazooClient|KazooState|ZnodeStat|Event|Thread|RLock|Lock|Condition|Path)"),
    # Private classes appear as bases and in signatures; autodoc documents no private names.
    (r"py:class", r"(.*\.)?_\w+"),
]

html_theme = "furo"
html_title = f"zkgroups {release}"
html_static_path = ["_static"]
html_css_files = ["zkgroups.css"]
html_show_sourcelink = False
