"""The shipped rule set: it loads, every rule in it was proved, and every rule holds on random
inputs of the reference evaluator."""

import pytest

from pcgopt.rules import RULES_FILE, load, load_records
from pcgopt.rules.candidates import kind
from pcgopt.verify.instances import compare, instances

RECORDS = load_records() if RULES_FILE.exists() else []


def test_the_shipped_file_exists_and_loads():
    assert RULES_FILE.exists(), "run python -m pcgopt.rules generate --out rules/rules.json"
    rules = load()
    assert len(rules) == len(RECORDS) > 100
    kinds = {kind(r) for r in rules}
    assert kinds == {"algebraic", "parallel"}
    assert len({r.name for r in rules}) == len(rules)


def test_every_shipped_rule_was_proved_for_all_degrees():
    for rule, meta in RECORDS:
        assert meta["verdict"]["status"] == "proved", rule.name
        assert meta["verdict"]["degrees"] == "all", rule.name
        assert meta["kind"] == kind(rule)


@pytest.mark.parametrize(("rule", "meta"), RECORDS, ids=[r.name for r, _ in RECORDS])
def test_every_shipped_rule_holds_on_random_inputs(rule, meta):
    insts = instances(rule, count=2, seed=7)
    assert insts, f"{rule.name}: no instance with both sides well-formed"
    for k, inst in enumerate(insts):
        mismatch = compare(rule, inst, seed=11 + k)
        assert mismatch is None, str(mismatch)
