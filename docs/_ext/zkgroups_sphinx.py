"""Directives that generate parts of the zkgroups docs from the code, so the two cannot disagree.

* ``zkgroups-modules PACKAGE``: a section per module of PACKAGE (the package itself first,
  then its modules and subpackages in name order), each an ``automodule`` of its docstrings.
  A module added to the package appears without editing the docs. Every object is
  documented once, in the module that defines it (a package's re-exports are not repeated).
* ``zkgroups-config``: one component's configuration as a table of TOML key, command-line
  flag, environment variable, default and meaning, read from its config dataclass (keys,
  defaults, the comment beside each field) and its click command (flags, environment
  variables, help): a key or an option added to either appears without editing the docs.
* ``zkgroups-bad-input``: the table of bad command lines that ``tests/cli/test_cli_bad_input.py``
  runs, with the text each error line must contain: both read ``bad_input_cases.toml`` beside
  this file (the docs build imports nothing of the tests: the ``docs`` extra has no pytest).

And two adjustments that keep the docstrings as they are written:

* A short reference (``:class:`InvalidConfig``` in a module that imports it) resolves to
  the one documented object of that name anywhere in the API, as Sphinx does for
  ``:class:`.InvalidConfig```; a name that matches several objects stays an error.
* napoleon reads Google- and NumPy-style sections of functions and classes, but not the
  one-line ``#:`` comments of constants and attributes, whose first colon it would take for
  a type (``#: Default death budget: 3``).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pkgutil
import re
from typing import Dict, List, Optional, Sequence

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

BAD_INPUT_CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bad_input_cases.toml")


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


def _rst_table(header: Sequence[str], rows: Sequence[Sequence[str]], widths: str = "auto") -> List[str]:
    lines = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}", "   :class: zkgroups-table", ""]
    for row in [header, *rows]:
        for i, cell in enumerate(row):
            text = " ".join(str(cell).split()) or "\\-"
            lines.append(("   * - " if i == 0 else "     - ") + text)
    return lines + [""]


def _literal(text: str) -> str:
    return f"``{text}``" if text else ""


def _field_comments(cls) -> Dict[str, str]:
    """The ``# comment`` beside each field of a dataclass, by field name."""
    comments = {}
    for line in inspect.getsource(cls).splitlines():
        match = re.match(r"\s+(\w+)\s*:[^#]*#\s*(.*)$", line)
        if match:
            comments[match.group(1)] = match.group(2).strip()
    return comments


def _show_default(value) -> str:
    if value is None or not isinstance(value, (str, int, float, tuple, list, dict)):
        return ""  # None, dataclasses.MISSING, click's "no default" sentinel
    if isinstance(value, bool):
        return _literal(str(value).lower())
    if isinstance(value, (tuple, list)):
        return _literal(", ".join(map(str, value)))
    if value == "":
        return '``""``'
    return _literal(str(value))


def _command(spec: str):
    """``module:object`` then subcommand names: the click command they name."""
    target, *path = spec.split()
    module, _, name = target.partition(":")
    command = getattr(importlib.import_module(module), name)
    commands = [command]
    for part in path:
        command = command.commands[part]
        commands.append(command)
    return commands


def _options(commands) -> Dict[str, "click.Option"]:
    import click
    found = {}
    for command in commands:
        for param in command.params:
            if isinstance(param, click.Option) and param.name not in ("help", "version"):
                found[param.name] = param
    return found


def _flag(option) -> str:
    names = [*option.opts, *option.secondary_opts]
    text = "/".join(names) if option.secondary_opts else ", ".join(names)
    if not option.is_flag and option.metavar:
        text += f" {option.metavar}"
    return _literal(text)


def _envvar(option) -> str:
    envvar = option.envvar
    if isinstance(envvar, (list, tuple)):
        envvar = ", ".join(envvar)
    return _literal(envvar or "")


def _escape(text: str) -> str:
    """Plain text as reStructuredText shows it (no emphasis, literals or references)."""
    return re.sub(r"([\\*`|_])", r"\\\1", text)


def _help(option, has_default: bool = True) -> str:
    text = option.help or ""
    if has_default:  # the default has its own column
        text = re.sub(r"\s*\[[^\]]*\](?=[.;,(]|\s*$)", "", text)
    return _escape(text.strip())


def _flag_and_envvar(option) -> str:
    if option is None:
        return ""
    envvar = _envvar(option)
    return _flag(option) + (f" (env {envvar})" if envvar else "")


class ConfigDirective(SphinxDirective):
    """``.. zkgroups-config::`` with ``:dataclass: module.Class`` (optional), ``:command: module:obj
    [sub ...]``, ``:keys: a, b`` (keys read besides the dataclass's fields), ``:flags: key=name``
    (a key set by an option of another name)."""

    option_spec = {"dataclass": str, "command": str,
                   "keys": lambda text: [t.strip() for t in text.split(",") if t.strip()],
                   "flags": lambda text: dict(t.strip().split("=", 1) for t in text.split(",") if t.strip())}

    def run(self):
        options = _options(_command(self.options["command"])) if "command" in self.options else {}
        renamed = self.options.get("flags", {})
        keys, defaults, comments = list(self.options.get("keys", [])), {}, {}
        if "dataclass" in self.options:
            module, _, name = self.options["dataclass"].rpartition(".")
            cls = getattr(importlib.import_module(module), name)
            comments = _field_comments(cls)
            for field in dataclasses.fields(cls):
                keys.append(field.name)
                defaults[field.name] = (field.default_factory() if field.default_factory is not dataclasses.MISSING
                                        else field.default)
        rows, used = [], set()
        for key in keys:
            option = options.get(renamed.get(key, key))
            if option is not None:
                used.add(option.name)
            default = _show_default(defaults.get(key, option.default if option is not None else None))
            meaning = (_help(option, bool(default)) if option is not None else "") or _escape(comments.get(key, ""))
            rows.append((_literal(key), _flag_and_envvar(option), default, meaning))
        for name, option in options.items():
            if name not in used:
                default = _show_default(None if option.default in ((), False) else option.default)
                rows.append(("", _flag_and_envvar(option), default, _help(option, bool(default))))
        header = ("TOML key", "flag (environment)", "default", "meaning")
        if not keys:
            return self._parse(_rst_table(header[1:], [row[1:] for row in rows], "30 15 55"))
        return self._parse(_rst_table(header, rows, "24 26 12 38"))

    def _parse(self, lines):
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="zkgroups-config"), container)
        return container.children


class BadInputDirective(ConfigDirective):
    """``.. zkgroups-bad-input::``: the cases tests/cli/test_cli_bad_input.py runs (bad_input_cases.toml)."""

    option_spec = {}

    def run(self):
        from coordinator.config import tomllib
        with open(BAD_INPUT_CASES, "rb") as f:
            cases = tomllib.load(f)["cases"]
        rows = [(_literal(tool), _literal(args), _literal(match)) for tool, args, match in cases]
        return self._parse(_rst_table(("tool", "arguments", "the error line contains"), rows, "10 50 40"))


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
    reftype = f"py:{node['reftype']}"
    if any(re.fullmatch(kind, reftype) and re.fullmatch(target, node["reftarget"])
           for kind, target in app.config.nitpick_ignore_regex):
        return None  # a type of the standard library or of another package: no home here
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
    app.add_directive("zkgroups-config", ConfigDirective)
    app.add_directive("zkgroups-bad-input", BadInputDirective)
    app.connect("missing-reference", resolve_short_reference)
    app.connect("autodoc-process-signature", unquote_annotations)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
