"""``python -m pcgopt.verify FILE``: verify every rule of a rule file.

    python -m pcgopt.verify rules.json [--json OUT] [--workers N] [--timeout S]
    python -m pcgopt.verify graph_subst.json --format flexflow

Prints a progress line while it works and then a summary: how many rules were proved (for all
degrees, or for powers of two up to 64), refuted (with counterexamples), unknown, and not
translatable (FlexFlow rules over operators or conventions pcgopt does not have), and the time
per rule. ``--json`` writes every verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pcgopt.arguments import positive_int, positive_number
from pcgopt.progress import Progress
from pcgopt.rewrite import Rule, RuleError, load_rules
from pcgopt.verify.prove import verify_record
from pcgopt.workers import imap_unordered


def fix_symbols(rule: Rule, values: dict[str, int]) -> Rule:
    """The rule with some symbols replaced by numbers (``--fix k=2``)."""
    from pcgopt.verify.instances import substitute

    return Rule(
        rule.name,
        substitute(rule.lhs, values),
        substitute(rule.rhs, values),
        rule.inputs,
        rule.example,
    )


def load(path: Path, fmt: str) -> tuple[list[Rule], dict[str, str]]:
    """The rules of a file, and for FlexFlow files the rules that could not be translated."""
    text = path.read_text()
    if fmt == "flexflow":
        from pcgopt.verify.flexflow import translate_collection

        return translate_collection(json.loads(text))
    return [r for r, _ in load_rules(text)], {}


def summarize(
    verdicts: Sequence[dict], untranslatable: dict[str, str], wall: float, workers: int
) -> str:
    counts = Counter(v["status"] for v in verdicts)
    degrees = Counter(v["degrees"] for v in verdicts if v["status"] == "proved")
    ill_typed = sum(1 for v in verdicts if v["never_well_formed"])
    times = [v["seconds"] for v in verdicts]
    lines = [
        f"rules: {len(verdicts) + len(untranslatable)}",
        f"  proved            {counts['proved']:5d}"
        + (
            f"   (all degrees: {degrees['all']}, powers of two up to 64: "
            f"{degrees['powers of two up to 64']})"
            if counts["proved"]
            else ""
        ),
        f"  refuted           {counts['refuted']:5d}"
        + (
            f"   (sides differ: {counts['refuted'] - ill_typed}, never both well-formed: "
            f"{ill_typed})"
            if counts["refuted"]
            else ""
        ),
        f"  unknown           {counts['unknown']:5d}",
        f"  not translatable  {len(untranslatable):5d}",
        f"time: {wall:.1f} s wall on {workers} worker(s)"
        + (
            f"; per rule: median {statistics.median(times):.2f} s, "
            f"mean {statistics.mean(times):.2f} s, max {max(times):.2f} s"
            if times
            else ""
        ),
    ]
    conflicts = [v for v in verdicts if v["axiom_conflict"]]
    if conflicts:
        lines.append("AXIOM CONFLICTS (Z3 proved what the evaluator refutes: an axiom is wrong):")
        lines += [f"  {v['rule']}: {v['counterexample']}" for v in conflicts]
    for status in ("refuted", "unknown"):
        chosen = [v for v in verdicts if v["status"] == status]
        if chosen:
            lines.append(f"{status}:")
            for v in sorted(chosen, key=lambda v: v["rule"]):
                detail = v["counterexample"] or "; ".join(v["notes"])
                lines.append(f"  {v['rule']}: {detail}")
    if untranslatable:
        reasons = Counter(untranslatable.values())
        lines.append("not translatable:")
        lines += [f"  {n:4d} x {why}" for why, n in reasons.most_common()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pcgopt.verify", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("file", type=Path)
    parser.add_argument("--format", choices=("pcgopt", "flexflow"), default="pcgopt")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write all verdicts as JSON")
    parser.add_argument("--workers", type=positive_int, default=max(1, os.cpu_count() or 1))
    parser.add_argument(
        "--timeout",
        type=positive_number,
        default=10.0,
        help="Z3 work per rule, in seconds at a fixed rate of Z3's work units (default 10)",
    )
    parser.add_argument(
        "--checks", type=positive_int, default=12, help="concrete instances per rule (default 12)"
    )
    parser.add_argument("--limit", type=positive_int, help="only the first N rules")
    parser.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="SYMBOL=N",
        help="verify with a symbol fixed, e.g. --fix k=2 (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        rules, untranslatable = load(args.file, args.format)
    except OSError as e:
        print(
            f"python -m pcgopt.verify: error: cannot read {args.file}: {e.strerror}",
            file=sys.stderr,
        )
        return 2
    except (RuleError, json.JSONDecodeError, UnicodeDecodeError) as e:
        print(f"python -m pcgopt.verify: error: {args.file}: {e}", file=sys.stderr)
        return 2
    if args.limit is not None:
        rules = rules[: args.limit]
    fixed = {}
    for item in args.fix:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            print(
                f"python -m pcgopt.verify: error: --fix takes SYMBOL=N, got {item!r}",
                file=sys.stderr,
            )
            return 2
        fixed[name.strip()] = int(value)
    if fixed:
        rules = [fix_symbols(r, fixed) for r in rules]
    jobs = [(r.to_dict(), args.timeout, args.checks) for r in rules]
    progress = Progress(len(jobs), "verifying")
    start = time.perf_counter()
    verdicts = []
    for v in imap_unordered(verify_record, jobs, args.workers):
        verdicts.append(v)
        progress.update(v["status"])
    progress.close()
    wall = time.perf_counter() - start
    order = {r.name: i for i, r in enumerate(rules)}
    verdicts.sort(key=lambda v: order[v["rule"]])
    print(summarize(verdicts, untranslatable, wall, args.workers))
    if args.json:
        args.json.write_text(
            json.dumps({"verdicts": verdicts, "not_translatable": untranslatable}, indent=1) + "\n"
        )
        print(f"wrote {args.json}")
    # Non-zero when a rule did not hold: a refuted rule, or an axiom the evaluator refutes.
    return 1 if any(v["axiom_conflict"] or v["status"] == "refuted" for v in verdicts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
