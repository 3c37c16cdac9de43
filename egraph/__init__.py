"""pcgopt.egraph: PCGs and verified rules as an egglog e-graph; saturation under budgets; export.

Lives in the top-level folder ``egraph/`` and installs as ``pcgopt.egraph`` (see DESIGN.md).
Its contents arrive with the e-graph issue; nothing here is importable API yet.
"""
