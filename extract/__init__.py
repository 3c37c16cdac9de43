"""pcgopt.extract: cost model, extraction, machine-mapping DP, placement and reduction synthesis.

Lives in the top-level folder ``extract/`` and installs as ``pcgopt.extract`` (see DESIGN.md).
Its contents arrive with the cost-model and extraction issues; nothing here is importable API yet.
"""
