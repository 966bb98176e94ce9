"""Run one fuzz target (:mod:`tests.fuzz.targets`) under atheris, coverage-guided, from its
seed corpus: ``python -m tests.fuzz.run TARGET [--runs N | --seconds S] [--seed N]``. Exit
status 0: no failure; otherwise libFuzzer's (the crashing input is written to ``--artifacts``).

``bin/fuzz`` runs every target for a while; ``tests/fuzz/test_fuzz.py`` a fixed number of runs
with a fixed seed (a reproducible budget, not a time)."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import atheris

#: Inputs longer than this are not tried (znodes and configuration files are small; a batch of
#: this size has hundreds of records).
MAX_LEN = 8192


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("--runs", type=int, help="stop after this many inputs")
    ap.add_argument("--seconds", type=int, help="stop after this long")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--artifacts", default=tempfile.gettempdir(), help="where a crashing input is written")
    args = ap.parse_args(argv)
    with atheris.instrument_imports(include=["coordinator", "consumer"]):
        from tests.fuzz import targets
    if args.target not in targets.TARGETS:
        sys.exit(f"unknown target {args.target!r}: one of {', '.join(targets.TARGETS)}")
    corpus = tempfile.mkdtemp(prefix=f"fuzz-{args.target}-")
    for k, seed in enumerate(targets.seeds(args.target)):
        with open(os.path.join(corpus, f"seed-{k}"), "wb") as f:
            f.write(seed)
    flags = [f"-seed={args.seed}", f"-max_len={MAX_LEN}", "-timeout=10", "-rss_limit_mb=1024",
             f"-artifact_prefix={os.path.join(args.artifacts, args.target + '-')}", "-print_final_stats=1"]
    if args.target in ("znode", "config"):  # tokens that byte mutations rarely spell
        flags.append("-dict=" + os.path.join(os.path.dirname(os.path.abspath(__file__)), "json.dict"))
    if args.runs is not None:
        flags.append(f"-runs={args.runs}")
    if args.seconds is not None:
        flags.append(f"-max_total_time={args.seconds}")
    atheris.Setup([sys.argv[0], *flags, corpus], targets.TARGETS[args.target])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
