"""The shipped rule set: it loads, every rule in it was proved, and every rule holds on random
inputs of the reference evaluator."""

import pytest

from pcgopt.rewrite import Term, operators_of, walk
from pcgopt.rules import OPT_IN, RULES_FILE, SHIPPED, load, load_records
from pcgopt.rules.candidates import canonical_text, kind
from pcgopt.rules.families import MIN_RANK, OPERATORS_OF
from pcgopt.rules.generate import rule_rank
from pcgopt.verify.instances import SCALE, compare, instances

RECORDS = load_records() if all(p.exists() for p in SHIPPED.values()) else []


def test_the_shipped_files_exist_and_load():
    for preset, path in SHIPPED.items():
        assert path.exists(), f"run python -m pcgopt.rules generate --preset {preset} --out {path}"
    rules = load()
    assert len(rules) == len(RECORDS) > 100
    assert len(rules) == sum(len(load(p)) for p in SHIPPED.values())  # load() reads them all
    kinds = {kind(r) for r in rules}
    assert kinds == {"algebraic", "parallel"}
    assert len({r.name for r in rules}) == len(rules)


def test_each_preset_ships_the_ranks_it_is_for():
    # The matrix set's tensors have ranks 1 and 2; the other presets keep only rules with a
    # tensor of higher rank (an embedding's output counts) or of their own operators, so no
    # rule is shipped twice.
    assert max(rule_rank(r) for r in load(RULES_FILE)) == 2
    for preset, path in SHIPPED.items():
        if path != RULES_FILE and preset not in OPT_IN and preset not in OPERATORS_OF:
            assert all(rule_rank(r) >= MIN_RANK[preset] > 2 for r in load(path)), preset
    texts = [canonical_text(r) for p in SHIPPED.values() for r in load(p)]
    assert len(texts) == len(set(texts))


def test_a_preset_of_its_own_operators_has_one_on_each_side_of_every_rule():
    # What lets a model without them saturate without that file (egraph's shipped_presets).
    for preset, ops in OPERATORS_OF.items():
        rules = load(SHIPPED[preset])
        assert rules, preset
        for rule in rules:
            for side in (rule.lhs, rule.rhs):
                used = {t.op for e in side for t in walk(e) if isinstance(t, Term)}
                assert used & set(ops), (preset, rule.name, side)
        # And no other preset's rule builds one.
        for other, path in SHIPPED.items():
            if other != preset:
                for rule in load(path):
                    used = {
                        t.op for e in (*rule.lhs, *rule.rhs) for t in walk(e) if isinstance(t, Term)
                    }
                    assert not used & set(ops), (other, rule.name)


def test_every_rule_of_a_higher_preset_needs_a_tensor_of_its_rank_on_each_side():
    # What lets a model without such a tensor saturate without that file (egraph's
    # shipped_presets): neither direction of the rule can match there.
    from pcgopt.verify.logic import rule_ranks

    for preset, path in SHIPPED.items():
        if MIN_RANK[preset] <= 2:
            continue
        for rule in load(path):
            for side in (rule.lhs, rule.rhs):
                ranks = rule_ranks(rule, side)
                assert max(ranks.values()) >= MIN_RANK[preset], (preset, rule.name, side)


def test_every_shipped_rule_was_proved_for_all_degrees():
    for rule, meta in RECORDS:
        assert meta["verdict"]["status"] == "proved", rule.name
        assert meta["verdict"]["degrees"] == "all", rule.name
        assert meta["kind"] == kind(rule)


@pytest.mark.parametrize(("rule", "meta"), RECORDS, ids=[r.name for r, _ in RECORDS])
def test_every_shipped_rule_holds_on_random_inputs(rule, meta):
    # The letters' sizes times 12 let degrees 2, 3, 4, 6 and 12 divide them; a rank-4 tensor of
    # 72 x 72 x 72 x 72 takes seconds to evaluate, so rank 4 scales by 2 (12 still divides).
    scale = SCALE if rule_rank(rule) < 4 else 2
    insts = instances(rule, count=2, seed=7, scale=scale)
    assert insts, f"{rule.name}: no instance with both sides well-formed"
    for k, inst in enumerate(insts):
        mismatch = compare(rule, inst, seed=11 + k)
        assert mismatch is None, str(mismatch)


def test_the_micro_batch_rules_each_cut_or_gather_and_stay_out_of_the_e_graph():
    from pcgopt.egraph import shipped_presets
    from pcgopt.ops.parallel import MICRO_BATCH_OPS
    from pcgopt.rules.families import USES

    rules = load(SHIPPED["pipeline"])
    assert len(rules) > 100 and USES["pipeline"] == MICRO_BATCH_OPS
    for rule in rules:
        assert operators_of((*rule.lhs, *rule.rhs)) & MICRO_BATCH_OPS, rule.name
    # Through every kind of operator a pipelined transformer has.
    moved = operators_of(e for r in rules for e in r.lhs)
    assert {"linear", "layer_norm", "batch_matmul", "softmax", "embedding", "gelu"} <= moved
    assert "pipeline" in OPT_IN and "pipeline" not in shipped_presets()
    # Nothing else ships a rule with them.
    for other, path in SHIPPED.items():
        if other != "pipeline":
            for rule in load(path):
                assert not operators_of((*rule.lhs, *rule.rhs)) & MICRO_BATCH_OPS, (
                    other,
                    rule.name,
                )
