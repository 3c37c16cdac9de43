"""pcgopt.rules: the offline rule-generation job and the shipped, verified rule set.

``load()`` returns the shipped rules, every one proved by :func:`pcgopt.verify.verify_rule`
for all parallel degrees: ``rules.json`` (matrices; ``python -m pcgopt.rules generate``) and
``rules_transformer.json`` (dense layers, LayerNorm, elementwise operators, embedding lookups,
collectives and attention on rank-3 and rank-4 tensors; ``python -m pcgopt.rules generate
--preset transformer``) and ``rules_layouts.json`` (Partition and Replicate of two degrees
``k`` and ``j``, ranks 1 to 4; ``--preset layouts``; used by saturation only when asked,
:data:`OPT_IN`) and ``rules_lookups.json`` (embedding bags, a recommender's sparse features:
split by batch, table columns or rows; ``--preset lookups``; loaded only for models with
embedding bags) and ``rules_pipeline.json`` (Pipeline and Batch, Unity's micro-batch operators,
through every kind of operator a model pipelines; ``--preset pipeline``; never in the e-graph,
which does not model micro-batches: :data:`OPT_IN`). See
:mod:`pcgopt.rules.generate` for how they are found and :mod:`pcgopt.rules.families` for what
each preset enumerates.

>>> rules = load()
>>> all(meta["verdict"]["status"] == "proved" for _, meta in load_records())
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pcgopt.rewrite import Rule, load_rules

#: The shipped rule file of the matrix preset.
RULES_FILE = Path(__file__).with_name("rules.json")

#: The shipped rule file of the transformer preset (rank-3 and rank-4 tensors).
TRANSFORMER_RULES_FILE = Path(__file__).with_name("rules_transformer.json")

#: The shipped rule file of the layouts preset (layouts of two degrees, ranks 1 to 4).
LAYOUTS_RULES_FILE = Path(__file__).with_name("rules_layouts.json")

#: The shipped rule file of the lookups preset (embedding bags: rank-2 ids into rank-2 tables).
LOOKUPS_RULES_FILE = Path(__file__).with_name("rules_lookups.json")

#: The shipped rule file of the pipeline preset (Pipeline and Batch through operators).
PIPELINE_RULES_FILE = Path(__file__).with_name("rules_pipeline.json")

#: Every shipped rule file, by the preset that writes it.
SHIPPED = {
    "matrix": RULES_FILE,
    "transformer": TRANSFORMER_RULES_FILE,
    "layouts": LAYOUTS_RULES_FILE,
    "lookups": LOOKUPS_RULES_FILE,
    "pipeline": PIPELINE_RULES_FILE,
}

#: Shipped rule files that saturation uses only when asked (``saturate(..., presets=...)``):
#: the layouts of two degrees, which grow the e-graph by every pair of degrees, and the
#: micro-batch rules, which the e-graph cannot translate (it has no micro-batch counts).
OPT_IN = frozenset({"layouts", "pipeline"})


def load_records(path: Path | None = None) -> list[tuple[Rule, dict[str, Any]]]:
    """Every rule of a rule file (default: all shipped ones) with its record: kind
    ("algebraic" or "parallel"), the size it was found at, and the verifier's verdict."""
    if path is None:
        return [rec for p in SHIPPED.values() for rec in load_records(p)]
    if not path.exists():
        preset = next((k for k, v in SHIPPED.items() if v == path), "matrix")
        raise FileNotFoundError(
            f"no rule file at {path}; run "
            f"`python -m pcgopt.rules generate --preset {preset} --out {path}`"
        )
    return load_rules(path.read_text())


def load(path: Path | None = None) -> list[Rule]:
    """The rules of a rule file (default: all shipped ones)."""
    return [rule for rule, _ in load_records(path)]


__all__ = [
    "LAYOUTS_RULES_FILE",
    "LOOKUPS_RULES_FILE",
    "OPT_IN",
    "PIPELINE_RULES_FILE",
    "RULES_FILE",
    "SHIPPED",
    "TRANSFORMER_RULES_FILE",
    "load",
    "load_records",
]
