"""Evaluation: answer extraction and exact match (`answers`), the judge protocol (`judge`), sandbox (`sandbox`)."""
