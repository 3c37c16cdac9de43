"""The generation job at small scale: it finds the expected rules, only proved ones, and the
same file every time."""

import pytest

from pcgopt.rewrite import Rule, Term, Var, load_rules
from pcgopt.rules.candidates import Candidate, canonical_text, kind, lift, lifts, readable
from pcgopt.rules.enumerate import (
    Config,
    Enumerator,
    fingerprint,
    input_values,
    swap_candidates,
)
from pcgopt.rules.generate import Pruner, Stats, generate, rule_file

SMALL = Config(max_ops=2, ops=("relu", "add", "partition", "combine", "replicate", "reduce"))


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("work")
    return generate(SMALL, workers=1, work_dir=work, timeout=3), work


def text_of(rule):
    return f"{rule.lhs} => {rule.rhs}"


def test_finds_the_expected_rules(small_run):
    gen, _ = small_run
    texts = {canonical_text(r).split(" | ")[0] for r in gen.rules}
    assert "relu(partition(v0, dim=0, degree=k)) => partition(relu(v0), dim=0, degree=k)" in texts
    assert "combine(partition(v0, dim=1, degree=k), dim=1, degree=k) => v0" in texts
    assert "add(v0, v1) => add(v1, v0)" in texts
    kinds = {kind(r) for r in gen.rules}
    assert kinds == {"algebraic", "parallel"}


def test_every_written_rule_is_proved(small_run):
    gen, _ = small_run
    assert gen.rules
    for r in gen.rules:
        v = gen.verdicts[r.name]
        assert v["status"] == "proved" and v["degrees"] == "all"


def test_the_same_flags_write_the_same_file(small_run, tmp_path):
    gen, work = small_run
    first = rule_file(gen, SMALL)
    again = generate(SMALL, workers=2, work_dir=work, timeout=3)  # resumes from the work dir
    fresh = generate(SMALL, workers=1, work_dir=tmp_path / "fresh", timeout=3)
    assert rule_file(again, SMALL) == first
    assert rule_file(fresh, SMALL) == first
    records = load_rules(first)
    assert len(records) == len(gen.rules)
    assert all(meta["verdict"]["status"] == "proved" for _, meta in records)


def test_shards_are_independent_and_deterministic():
    e = Enumerator(SMALL)
    first = [[g.key for g in e.run(s).graphs] for s in range(e.shards())]
    again = [[g.key for g in Enumerator(SMALL).run(s).graphs] for s in range(e.shards())]
    assert first == again


def test_fingerprints_see_parallel_shapes_and_values():
    values = input_values(SMALL)
    x = values[0]
    from pcgopt.ops import get_op

    part = get_op("partition")
    p = part.make_params({"dim": 0, "degree": 2}, (x.shape,))
    (y,) = part.evaluate(p, (x,), part.infer(p, (x.shape,)))
    assert fingerprint(y) != fingerprint(x)  # same values, different distribution
    assert fingerprint(x) == fingerprint(values[0])


def test_cli_generate(tmp_path, capsys):
    from pcgopt.rules.__main__ import main

    out = tmp_path / "rules.json"
    assert (
        main(
            [
                "generate",
                "--max-ops",
                "2",
                "--ops",
                "relu,partition,combine",
                "--workers",
                "1",
                "--out",
                str(out),
                "--work-dir",
                str(tmp_path / "w"),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and "peak memory" in text
    assert load_rules(out.read_text())


def test_commutative_operators_get_their_swap_as_a_rule():
    # The enumerator builds one input order of add, so the swap must come as a rule.
    pairs = swap_candidates(Config(ops=("add", "matmul", "stack_partial")))
    assert [(repr(a), repr(b)) for a, b in pairs] == [
        ("add(x1, x2)", "add(x2, x1)"),
        ("stack_partial(x1, x2)", "stack_partial(x2, x1)"),
    ]


def test_lifting_asks_only_for_the_equal_sizes_the_rule_needs():
    # Found on x1: [2, 4] and w1: [4, 4]; the rule needs only x1's columns = w1's rows.
    x1, w1 = Var("x1"), Var("w1")
    c = Candidate((Term("relu", (Term("matmul", (x1, w1)),)),), (Term("matmul", (x1, w1)),))
    general, plain = lifts(c, Config())
    assert {k: repr(v) for k, v in general.inputs.items()} == {"x1": "f32[a, b]", "w1": "f32[b, c]"}
    assert {k: repr(v) for k, v in plain.inputs.items()} == {"x1": "f32[a, b]", "w1": "f32[b, b]"}


def test_a_square_only_rule_does_not_prune_a_general_one():
    # relu(partition(w)) = partition(relu(w)) found on a square weight must not make the same rule
    # on a [2, 4] tensor look implied: rewriting respects the rule's declarations.
    config = Config(max_ops=2, ops=("relu", "partition"))
    w1, x1 = Var("w1"), Var("x1")

    def cand(v):
        part = Term("partition", (v,), {"dim": 0, "degree": 2})
        return Candidate(
            (Term("relu", (part,)),),
            (Term("partition", (Term("relu", (v,)),), {"dim": 0, "degree": 2}),),
        )

    square, general = cand(w1), cand(x1)
    pruner = Pruner(config)
    sq = lift(square, config)
    assert repr(sq.inputs["w1"]) == "f32[a, a]"
    pruner.admit(square, (sq,))
    stats = Stats()
    kept, _ = pruner.prune([general], {general.text: lift(general, config)}, {}, stats, "test")
    assert kept == [general] and stats.pruned_implied == 0


def test_shipped_rules_name_their_tensors_by_appearance():
    rule = readable(
        Rule.parse(
            "r",
            "split(concat(p1, w1, axis=0), axis=0, sizes=(size(p1, 0), size(w1, 0)))[1]",
            "w1",
            {"p1": "[a, b]", "w1": "[c, b]"},
        )
    )
    assert (
        repr(rule.lhs[0])
        == "split(concat(x1, x2, axis=0), axis=0, sizes=(size(x1, 0), size(x2, 0)))[1]"
    )
    assert list(rule.inputs) == ["x1", "x2"]


def test_rule_sides_built_under_different_input_orders_still_pair():
    # The search builds mul(x1, add(x2, x3)) only as mul(x3, add(x1, x2)) (inputs in order), which
    # does not pair with add(mul(x1, x2), mul(x1, x3)); distributivity needs the renamed graph.
    from pcgopt.rules.candidates import candidates
    from pcgopt.rules.enumerate import run_shards

    config = Config(max_ops=3, ops=("add", "mul"))
    result = run_shards(config, range(Enumerator(config).shards()))
    found = {
        (repr(c.lhs[0]), repr(c.rhs[0]))
        for c in candidates(config, result.graphs, result.identities, fingerprint)
    }
    lhs, rhs = "add(mul(x1, x2), mul(x1, x3))", "mul(x1, add(x2, x3))"
    assert (lhs, rhs) in found or (rhs, lhs) in found


def test_an_axiom_conflict_stops_the_job_and_names_the_rule(monkeypatch):
    # The axioms "prove" a rule the evaluator refutes: no proof from them can be trusted, so
    # no file is written (here the verifier is made to report one such conflict).
    from dataclasses import replace

    import pcgopt.verify as verify
    from pcgopt.rules.generate import AxiomConflictError

    real, conflicted = verify.verify_rule, []

    def verify_with_a_conflict(rule, *args, **kwargs):
        v = real(rule, *args, **kwargs)
        if conflicted:
            return v
        conflicted.append(rule.name)
        return replace(v, status="refuted", axiom_conflict=True, counterexample="at x: differ")

    monkeypatch.setattr(verify, "verify_rule", verify_with_a_conflict)
    tiny = Config(max_ops=2, ops=("relu", "partition", "combine"))
    with pytest.raises(AxiomConflictError, match="an axiom is wrong") as caught:
        generate(tiny, workers=1, work_dir=None, timeout=3)
    assert f"{conflicted[0]}: at x: differ" in str(caught.value)
