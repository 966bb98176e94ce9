"""Every runtime module with logic has a test file named after it, as kafka-python keeps
``test/consumer/test_subscription_state.py`` beside ``kafka/consumer/subscription_state.py``: a
newcomer who reads ``consumer/claims.py`` finds its tests by name, in ``test_claims.py``.

The rule, read from the source (no imports):

* A runtime module is a ``.py`` file under ``consumer/`` or ``coordinator/`` longer than
  :data:`MIN_LINES`. Left out: package ``__init__`` modules (exports and the package's
  docstring) and the test harness in ``coordinator/testing`` (exercised by every test that
  starts a server; its own tests are ``tests/coordinator/test_zkserver.py`` and
  ``tests/dataplane/test_kafkamock.py``).
* Its test file is ``test_<module>.py`` anywhere under ``tests/`` (``tests/unit`` when it needs
  no server), or ``test_<package>_<module>.py`` (``tests/spark/test_spark_source.py`` for
  ``consumer/spark/source.py``, ``tests/dataplane/test_log_batch.py`` for ``consumer/log/batch.py``).
* A command-line module (``consumer/cli``, ``coordinator/cli``) is tested by command, under
  ``tests/cli``: ``test_<tool>_<module>.py`` (``test_groupctl_reset.py`` for
  ``consumer/cli/reset.py``) or ``test_<module>_<...>.py`` (``test_coordinatord_cli.py``); or,
  where its command is tested with what it serves, the file :data:`CLI_BY_COMMAND` names, which
  must run the command (its words appear in the file).
* :data:`NAMED_OTHERWISE` maps a module to the one test file its family shares, with why;
  :data:`ALLOWED` lists what has no logic worth a file of its own, with why. Each list only
  names modules that need it (checked). A new module gets its test file with it.
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIN_LINES = 80
PACKAGES = ("consumer", "coordinator")
HARNESS = os.path.join("coordinator", "testing")
CLI_FOLDERS = (os.path.join("consumer", "cli"), os.path.join("coordinator", "cli"))

#: module -> (the test file that covers it under its family's name, why that file).
NAMED_OTHERWISE = {
    "coordinator/assignors/range.py": ("tests/unit/test_assignors.py",
                                       "every assignor in one table, property and oracle file, as kafka-python's "
                                       "test/test_assignors.py"),
    "coordinator/assignors/sticky.py": ("tests/unit/test_assignors.py",
                                        "every assignor in one table, property and oracle file, as kafka-python's "
                                        "test/test_assignors.py"),
    "coordinator/protocol/groups.py": ("tests/unit/test_protocol.py",
                                       "every znode schema's round trip and bad payloads in one table"),
    "coordinator/protocol/cluster.py": ("tests/unit/test_protocol.py",
                                        "every znode schema's round trip and bad payloads in one table"),
    "coordinator/protocol/paths.py": ("tests/unit/test_protocol.py", "the paths table is tested with the schemas"),
    "consumer/share.py": ("tests/share/test_share_consumer.py",
                          "its one class, the ShareConsumer, named as its siblings in tests/share"),
    "coordinator/zktls.py": ("tests/coordinator/test_zk_tls.py", "ZooKeeper over TLS, named as its siblings "
                                                                 "test_zk_sasl.py and test_zkclient.py"),
}

#: command-line module -> (the command's words as the tests run it, the test file that runs it, why there).
CLI_BY_COMMAND = {
    "consumer/cli/acls.py": ('"acl", "apply"', "tests/coordinator/test_acl.py",
                             "groupctl acl apply/check need a ZooKeeper with ACLs, which the ACL tests start"),
    "consumer/cli/exporter.py": ('"exporter"', "tests/console/test_metrics.py",
                                 "groupctl exporter is tested with the metrics it serves"),
    "consumer/cli/share_consume.py": ('"share-consume"', "tests/cli/test_groupctl_share.py",
                                      "groupctl share-consume beside the other share commands"),
    "consumer/cli/demo.py": ('"consumer.cli.demo"', "tests/coordinator/test_zk_tls.py",
                             "bin/demo is run whole only over TLS (~40 s); its parts are the tools'"),
    "consumer/cli/pipeline.py": ('"consumer.cli.pipeline"', "tests/spark/test_spark.py",
                                 "bin/pipeline runs on Spark: with the Spark tests, one session per module"),
    "consumer/cli/context.py": ('"--zk-timeout"', "tests/cli/test_cli_bad_input.py",
                                "the options every groupctl and pipeline command shares: every command's bad input"),
    "coordinator/cli/common.py": ("setup_logging", "tests/cli/test_logging.py",
                                  "the tools' plumbing: their logging, one-line errors and tables"),
}

#: module -> why it has no logic worth a test file of its own.
ALLOWED = {
    "coordinator/errors.py": "declarations only (the error hierarchy, messages and fields); each error is "
                             "checked by the tests of the module that raises it",
    "coordinator/groups.py": "only wires its parts (test_shard_follower.py, test_rebalance_handlers.py, "
                             "test_shard_terms.py); the whole is tests/coordinator/test_coordinator.py",
}


def runtime_modules():
    """{path: lines} of the runtime modules the rule is about (see the module docstring)."""
    out = {}
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            relative = os.path.relpath(folder, ROOT)
            if relative == HARNESS or relative.startswith(HARNESS + os.sep):
                continue
            for name in files:
                if name.endswith(".py") and name != "__init__.py":
                    path = os.path.join(relative, name)
                    with open(os.path.join(ROOT, path)) as f:
                        lines = sum(1 for _ in f)
                    if lines > MIN_LINES:
                        out[path.replace(os.sep, "/")] = lines
    return out


def files_of_tests():
    """{folder relative to the root: names of its test files without ``test_`` and ``.py``}."""
    out = {}
    for folder, dirs, files in os.walk(os.path.join(ROOT, "tests")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        names = {f[len("test_"):-len(".py")] for f in files if f.startswith("test_") and f.endswith(".py")}
        if names:
            out[os.path.relpath(folder, ROOT).replace(os.sep, "/")] = names
    return out


def named_after(path: str, tests) -> bool:
    """Whether a test file is named after the module ``path`` (the rule in the module docstring)."""
    module = os.path.basename(path)[:-len(".py")]
    package = os.path.basename(os.path.dirname(path))
    everywhere = set().union(*tests.values())
    if module in everywhere or f"{package}_{module}" in everywhere:
        return True
    if os.path.dirname(path) in {f.replace(os.sep, "/") for f in CLI_FOLDERS}:
        return any(name.endswith("_" + module) or name.startswith(module + "_") for name in tests.get("tests/cli", ()))
    return False


def without_a_test_file():
    tests = files_of_tests()
    return {path: lines for path, lines in runtime_modules().items() if not named_after(path, tests)}


def test_every_runtime_module_with_logic_has_a_test_file_named_after_it():
    missing = set(without_a_test_file()) - set(NAMED_OTHERWISE) - set(CLI_BY_COMMAND) - set(ALLOWED)
    assert not missing, (f"runtime modules over {MIN_LINES} lines without a test file named after them (add "
                         f"tests/<consumer|coordinator|unit>/test_<module>.py, see this file's docstring): "
                         f"{sorted(missing)}")


def test_the_lists_name_only_modules_that_need_them():
    """An entry whose module got a test file named after it, went below MIN_LINES or was
    renamed goes; a module is in one list at most; every reason is given."""
    lacking = set(without_a_test_file())
    listed = [set(NAMED_OTHERWISE), set(CLI_BY_COMMAND), set(ALLOWED)]
    assert all(not a & b for i, a in enumerate(listed) for b in listed[i + 1:]), "a module in two lists"
    stale = set().union(*listed) - lacking
    assert not stale, f"no longer without a test file named after them (drop them from the lists): {sorted(stale)}"
    assert all(reason.strip() for _, reason in NAMED_OTHERWISE.values()) and all(r.strip() for r in ALLOWED.values())
    assert all(why.strip() for _, _, why in CLI_BY_COMMAND.values())
    assert all(os.path.dirname(m) in {f.replace(os.sep, "/") for f in CLI_FOLDERS} for m in CLI_BY_COMMAND)


def test_the_test_files_named_otherwise_exist():
    missing = {module: test for module, (test, _) in NAMED_OTHERWISE.items()
               if not os.path.exists(os.path.join(ROOT, test))}
    assert not missing, f"NAMED_OTHERWISE points at test files that do not exist: {missing}"


def test_the_tests_named_for_a_command_run_it():
    missing = {}
    for module, (words, test, _) in CLI_BY_COMMAND.items():
        path = os.path.join(ROOT, test)
        if not os.path.exists(path):
            missing[module] = f"{test} does not exist"
            continue
        with open(path) as f:
            if words not in f.read():
                missing[module] = f"{test} does not run {words}"
    assert not missing, f"CLI_BY_COMMAND: {missing}"
