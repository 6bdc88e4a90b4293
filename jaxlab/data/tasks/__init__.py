"""Datasets with checkable ground truth shared by several papers: arithmetic word problems and math /
commonsense JSONL (`arithmetic`), synthetic scenes with per-patch truth (`scenes`), Parity / Cycle / Subsum with
templated chains of thought (`reasoning`)."""
