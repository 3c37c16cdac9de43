"""pcgopt.verify: operator axioms in first-order logic and the Z3 rule verifier.

Lives in the top-level folder ``verify/`` and installs as ``pcgopt.verify`` (see DESIGN.md).
Its contents arrive with the verification issue; nothing here is importable API yet.
"""
