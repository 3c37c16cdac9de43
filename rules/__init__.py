"""pcgopt.rules: the offline rule-generation job and the shipped, verified rule file.

Lives in the top-level folder ``rules/`` and installs as ``pcgopt.rules`` (see DESIGN.md).
Its contents arrive with the rule-generation issue; nothing here is importable API yet.
"""
