"""Directives that generate parts of the zkgroups docs from the code, so the two cannot disagree.

* ``zkgroups-modules PACKAGE``: a section per module of PACKAGE (the package itself first,
  then its modules and subpackages in name order), each an ``automodule`` of its docstrings.
  A module added to the package appears without editing the docs. Every object is
  documented once, in the module that defines it (a package's re-exports are not repeated).

And two adjustments that keep the docstrings as they are written:

* A short reference (``:class:`InvalidConfig``` in a module that imports it) resolves to
  the one documented object of that name anywhere in the API, as Sphinx does for
  ``:class:`.InvalidConfig```; a name that matches several objects stays an error.
* napoleon reads Google- and NumPy-style sections of functions and classes, but not the
  one-line ``#:`` comments of constants and attributes, whose first colon it would take for
  a type (``#: Default death budget: 3``).
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from typing import List, Optional, Sequence

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def package_modules(package: str, exclude=()) -> List[str]:
    """``package`` and every module under it, in name order, without those in ``exclude``
    (and their submodules)."""
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        names.append(info.name)
    return sorted(n for n in names if not any(n == e or n.startswith(e + ".") for e in exclude))


class ModulesDirective(SphinxDirective):
    """``.. zkgroups-modules:: PACKAGE`` with an optional ``:exclude: a.b, a.c``."""

    required_arguments = 1
    option_spec = {"exclude": lambda text: [t.strip() for t in text.split(",") if t.strip()]}

    def run(self):
        lines = []
        for name in package_modules(self.arguments[0], self.options.get("exclude", ())):
            lines += [f"``{name}``", "-" * (len(name) + 4), "", f".. automodule:: {name}", "   :ignore-module-all:", ""]
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="zkgroups-modules"), container)
        return container.children


def canonical_name(target: str, context: Sequence[str]) -> Optional[str]:
    """Where the object ``target`` names is defined (``module.Qual.name``), looked up as Python
    would from each of the ``context`` prefixes (the current class, module, or nothing)."""
    for prefix in context:
        path = f"{prefix}.{target}" if prefix else target
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attribute in parts[cut:]:
                    obj = getattr(obj, attribute)
            except AttributeError:
                break
            if cut == len(parts):
                return path  # a module
            owner = inspect.unwrap(obj) if callable(obj) else obj
            module, qualname = getattr(owner, "__module__", None), getattr(owner, "__qualname__", None)
            if module and qualname and module.split(".")[0] in ("coordinator", "consumer"):
                return f"{module}.{qualname}"
            return None  # a constant, or something from elsewhere: no canonical home to find
    return None


def resolve_short_reference(app, env, node, contnode):
    """``missing-reference``: a Python reference to a name imported where it is used (or
    re-exported by a package) resolves to the object's own documentation; otherwise try it
    as a suffix search (``.Name``), which still fails when several objects match."""
    if node.get("refdomain") != "py" or node["reftarget"].startswith(("_", ".")):
        return None
    domain = env.get_domain("py")
    module, cls = node.get("py:module"), node.get("py:class")
    context = [p for p in (f"{module}.{cls}" if module and cls else None, module) if p] + [""]
    canonical = canonical_name(node["reftarget"], context)
    if canonical and canonical != node["reftarget"]:
        found = domain.resolve_any_xref(env, node.get("refdoc", ""), app.builder, canonical, node, contnode)
        if len(found) == 1:
            return found[0][1]
    if not node.get("refspecific"):
        node["refspecific"] = True
        found = domain.resolve_xref(env, node.get("refdoc", ""), app.builder, node["reftype"], node["reftarget"],
                                    node, contnode)
        if found is not None:
            return found
    # A type alias in an annotation is referred to as a class but documented as data.
    found = domain.resolve_any_xref(env, node.get("refdoc", ""), app.builder, node["reftarget"], node, contnode)
    return found[0][1] if len(found) == 1 else None


def napoleon_skips_attributes(app):
    """Wrap napoleon's docstring handler so that it leaves constants and attributes alone."""
    from sphinx.ext import napoleon
    listeners = app.events.listeners["autodoc-process-docstring"]
    for i, listener in enumerate(listeners):
        if listener.handler is napoleon._process_docstring:
            def handler(app, what, name, obj, options, lines, _original=listener.handler):
                if what not in ("attribute", "data", "property"):
                    _original(app, what, name, obj, options, lines)
            listeners[i] = listener._replace(handler=handler)


def unquote_annotations(app, what, name, obj, options, signature, return_annotation):
    """``autodoc-process-signature``: a dataclass's fields under ``from __future__ import
    annotations`` reach the signature as quoted strings (``members: 'Dict[str, int]'``), and
    their default factories as ``<factory>``, neither of which the Python domain can parse."""
    if signature and ("'" in signature or "<factory>" in signature):
        signature = re.sub(r"(:\s*|->\s*)'([^']*)'", r"\1\2", signature)
        # A field's default_factory shows as <factory>, which is not Python: say "..." instead.
        signature = re.sub(r"\s*=\s*<factory>", " = ...", signature)
        return signature, return_annotation
    return None


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.setup_extension("sphinx.ext.napoleon")
    napoleon_skips_attributes(app)
    app.add_directive("zkgroups-modules", ModulesDirective)
    app.connect("missing-reference", resolve_short_reference)
    app.connect("autodoc-process-signature", unquote_annotations)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
