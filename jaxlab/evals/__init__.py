"""Evaluation: answer extraction and exact match (`answers`), the judge protocol (`judge`), the sandbox for
untrusted code (`sandbox`)."""
