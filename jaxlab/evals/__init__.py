"""Evaluation: answer extraction and exact match (`answers`), and the judge protocol (`judge`)."""
