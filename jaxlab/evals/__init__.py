"""Evaluation: answer extraction and exact match (`answers`), the judge protocol (`judge`), sandbox (`sandbox`).
Aggregation of sampled judge verdicts by Bradley-Terry-Davidson, with its baselines and metrics (`btd`). The BFCL
function-calling checker, leaderboard and strict modes, single- and multi-turn (`bfcl`, `bfcl_multi_turn`).
Refusal / harmful-compliance judging with ASR and RtA (`refusal`). Unified diffs parsed, applied and stripped of
protected files (`patches`). DV-World's table-value alignment, chart extraction in the sandbox and scores
(`charts`)."""
