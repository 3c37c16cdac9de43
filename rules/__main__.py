"""``python -m pcgopt.rules``: generate the rule set, or measure how much of a peer set it covers.

    python -m pcgopt.rules generate --max-ops 3 --workers 2 --out rules/rules.json
    python -m pcgopt.rules generate --preset transformer --out rules/rules_transformer.json
    python -m pcgopt.rules coverage --peer ../shared/peers/flexflow_graph_subst_3_v2.json

``generate`` keeps its intermediate results in ``--work-dir`` (default ``.pcgopt-rules-work``),
so an interrupted run resumes where it stopped; the same flags always write the same file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pcgopt.arguments import positive_int, positive_number
from pcgopt.rules import RULES_FILE, load
from pcgopt.rules.arity import WIDEST
from pcgopt.rules.candidates import kind
from pcgopt.rules.enumerate import Config
from pcgopt.rules.families import MIN_RANK, NAME_PREFIX, PRESETS, USES
from pcgopt.rules.generate import generate, merge, rule_file


def _peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def _generate(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    if args.preset == "matrix":
        defaults, *others = PRESETS["matrix"]
        configs: tuple[Config, ...] = (
            replace(
                defaults,
                max_ops=args.max_ops or defaults.max_ops,
                degree=args.degree,
                ops=tuple(args.ops.split(",")) if args.ops else defaults.ops,
            ),
            # --ops replaces what is enumerated: the preset's one-operator families go too.
            *(() if args.ops else (replace(c, degree=args.degree) for c in others)),
        )
    else:
        if args.ops or args.max_ops is not None:
            raise ValueError(f"--ops and --max-ops are the matrix preset's, not {args.preset}'s")
        configs = PRESETS[args.preset]
    gens = []
    for i, config in enumerate(configs):
        if len(configs) > 1:
            print(f"family {i + 1}/{len(configs)}: {', '.join(config.ops)}", file=sys.stderr)
        gens.append(
            generate(config, workers=args.workers, work_dir=args.work_dir, timeout=args.timeout)
        )
    gen = merge(gens, MIN_RANK[args.preset], NAME_PREFIX[args.preset], USES.get(args.preset))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(rule_file(gen, configs[0] if len(configs) == 1 else configs))
    s = gen.stats
    kinds = Counter(kind(r) for r in gen.rules)
    print(
        f"wrote {args.out}: {len(gen.rules)} proved rules "
        f"({kinds['algebraic']} algebraic, {kinds['parallel']} parallel)"
    )
    print(f"  enumerated {s.visited} graphs ({s.graphs} kept); {s.candidates} candidate rules")
    print(
        f"  dropped: {s.not_general} only well-formed at the enumeration's sizes, "
        f"{s.pruned_renaming} equal up to renaming, {s.pruned_implied} implied by smaller rules, "
        f"{s.pruned_redundant} proved but implied by the other proved rules, "
        f"{s.too_large} over the family's operator limit, "
        f"{s.not_two_degrees} without both degrees (second_degree only); "
        f"{s.implication_exhausted} implication searches ran out of work and kept their candidate"
    )
    print(
        f"  verified {s.verified}: proved {s.proved}, refuted {s.refuted}, unknown {s.unknown} "
        f"({s.rounds} round(s)); {s.widened} of them rules about concats widened to 3 to "
        f"{WIDEST} inputs and proved"
        + (f", {s.nested} splits two ways at once composed and proved" if s.nested else "")
    )
    if s.clock_stopped:
        print(
            f"  warning: Z3's wall-clock cap, not its work limit, decided {s.clock_stopped} "
            "verdict(s): another run may write a different file (the machine was too slow or "
            "too loaded for the cap; pcgopt.verify.limits)",
            file=sys.stderr,
        )
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in s.seconds.items())
    elapsed = time.perf_counter() - start
    print(f"  time: {elapsed:.1f} s ({phases}); peak memory {_peak_rss_mb():.0f} MB")
    return 0


def _coverage(args: argparse.Namespace) -> int:
    from pcgopt.rules.coverage import coverage
    from pcgopt.verify import verify_rules
    from pcgopt.verify.flexflow import translate_collection

    peer, skipped = translate_collection(json.loads(args.peer.read_text()))
    verdicts = verify_rules(peer, timeout_s=5)
    sound = [r for r, v in zip(peer, verdicts, strict=True) if v.status == "proved"]
    generated = load(args.rules)
    result = coverage(sound, generated)
    how = Counter(c.how for c in result)
    print(f"peer rules: {len(peer) + len(skipped)}; translated {len(peer)}, proved {len(sound)}")
    print(
        f"of the {len(sound)} proved: equal up to renaming {how['renaming']}, "
        f"implied by the generated set {how['implied']}, not covered {how['not covered']}"
    )
    for c in result:
        if c.how == "not covered":
            rule = next(r for r in sound if r.name == c.rule)
            print(
                f"  not covered: {c.rule}: {rule.lhs} => {rule.rhs}"
                + (f" ({c.note})" if c.note else "")
            )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pcgopt.rules", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="enumerate, pair, prune, lift and verify rules")
    g.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="matrix",
        help="what to enumerate (pcgopt.rules.families; default matrix, the rules.json set)",
    )
    g.add_argument(
        "--max-ops", type=positive_int, default=None, help="matrix preset only (default 3)"
    )
    g.add_argument(
        "--degree",
        type=positive_int,
        default=2,
        help="parallel degree to enumerate with (default 2)",
    )
    g.add_argument("--ops", help="comma-separated operators (default: the full enumeration set)")
    g.add_argument("--workers", type=positive_int, default=max(1, os.cpu_count() or 1))
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--work-dir", type=Path, default=Path(".pcgopt-rules-work"))
    g.add_argument(
        "--timeout",
        type=positive_number,
        default=3.0,
        help="Z3 work per rule, in seconds at a fixed rate of Z3's work units: the same on "
        "any machine load (default 3; pcgopt.verify.limits)",
    )
    g.set_defaults(run=_generate)
    c = sub.add_parser("coverage", help="how much of a peer rule set the generated set covers")
    c.add_argument("--rules", type=Path, default=RULES_FILE)
    c.add_argument("--peer", type=Path, required=True, help="FlexFlow's graph_subst JSON")
    c.set_defaults(run=_coverage)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (OSError, ValueError) as e:
        print(f"python -m pcgopt.rules {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"python -m pcgopt.rules {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
