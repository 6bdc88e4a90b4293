"""The papers' claims as data, and their verdicts computed from results.json only.

Each experiment declares `Claim`s: an id, the claim in one line, the paper's own figure, a check over its
results.json keys, and the presets it applies to. A check is an expression over `{key}` references
(`"{val_loss.scale} < {val_loss.galore}"`), evaluated with arithmetic, comparisons, `and`/`or`/`not`,
`abs`/`min`/`max` and nothing else. Over several seeds a claim is reproduced or not reproduced when every seed
agrees, and unstable (with the spread of its keys) when they do not.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import operator
import re

# The nineteen papers, in the order of papers/DIGEST.md: short name -> title.
PAPERS = {
    "scale": "SCALE: column-normalized SGD with last-layer momentum",
    "cdka": "Component Designed Kronecker Adapters",
    "fslora": "Federated Sketching LoRA",
    "spec_dllm": "Trajectory-level speculative decoding for diffusion LMs",
    "latentlens": "LatentLens",
    "lost_in_attention": "Residual-update geometry of LVLMs",
    "polar": "Program-of-Layers",
    "tele_lens": "Probing latent planning",
    "conpress": "Self-compression under multi-question pressure",
    "prm_attack": "PRM exploitability",
    "bfcl_audio": "Audio function calling",
    "btd": "Distribution-calibrated aggregation of thinking judges",
    "bao": "Proactive agents via agentic RL",
    "pia": "Persona-Invariant Alignment",
    "mind": "Multi-rationale discriminative reasoning",
    "gig": "Graph-in-Graph planning",
    "stllm": "Spatio-temporal LLM",
    "susvibes": "Secure vibe coding benchmark",
    "dvworld": "Data-visualization agent benchmark",
}

REPRODUCED, NOT_REPRODUCED, UNSTABLE, NOT_MEASURABLE = ("reproduced", "not reproduced", "unstable",
                                                        "not measurable at this preset")
NOT_RUN, FAILED = "not run in this report", "experiment failed"
_KEY = re.compile(r"\{([^{}]+)\}")


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim of a paper, checkable on results.json.

  Attributes:
    id: short identifier, unique within the experiment.
    text: the claim in one line.
    paper: the paper's figure for it, as the paper states it.
    check: expression over `{results key}` references that is true when the claim holds.
    presets: the presets whose scale the claim applies to (elsewhere: not measurable at this preset).
  """
  id: str
  text: str
  paper: str
  check: str
  presets: tuple[str, ...] = ("cpu", "full")

  def __post_init__(self):
    if not self.keys:
      raise ValueError(f"claim {self.id!r}: check {self.check!r} names no {{results key}}")
    _parse(self.check, self.id)  # fails now, at registration, on a malformed check

  @property
  def keys(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys(_KEY.findall(self.check)))


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}
_FUNCS = {"abs": abs, "min": min, "max": max}


def _parse(check: str, claim_id: str) -> ast.Expression:
  names = {k: f"_k{i}" for i, k in enumerate(dict.fromkeys(_KEY.findall(check)))}
  source = _KEY.sub(lambda m: names[m.group(1)], check)
  try:
    tree = ast.parse(source, mode="eval")
  except SyntaxError as e:
    raise ValueError(f"claim {claim_id!r}: check {check!r} does not parse ({e.msg})") from None
  for node in ast.walk(tree):
    ok = isinstance(node, (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub,
                           ast.Compare, ast.BinOp, ast.Constant, ast.Name, ast.Load, ast.Call,
                           *_BINOPS, *_CMPOPS))
    if isinstance(node, ast.Call):
      ok = isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords
    if isinstance(node, ast.Name):
      ok = node.id in _FUNCS or node.id.startswith("_k")
    if not ok:
      raise ValueError(f"claim {claim_id!r}: check {check!r} uses {type(node).__name__}, which checks may not")
  return tree


def _eval(node, env):
  if isinstance(node, ast.Expression):
    return _eval(node.body, env)
  if isinstance(node, ast.Constant):
    return node.value
  if isinstance(node, ast.Name):
    return env[node.id] if node.id in env else _FUNCS[node.id]
  if isinstance(node, ast.BoolOp):
    vals = [_eval(v, env) for v in node.values]
    return all(vals) if isinstance(node.op, ast.And) else any(vals)
  if isinstance(node, ast.UnaryOp):
    v = _eval(node.operand, env)
    return (not v) if isinstance(node.op, ast.Not) else -v
  if isinstance(node, ast.BinOp):
    return _BINOPS[type(node.op)](_eval(node.left, env), _eval(node.right, env))
  if isinstance(node, ast.Compare):
    left = _eval(node.left, env)
    for op, comp in zip(node.ops, node.comparators):
      right = _eval(comp, env)
      if not _CMPOPS[type(op)](left, right):
        return False
      left = right
    return True
  if isinstance(node, ast.Call):
    return _eval(node.func, env)(*(_eval(a, env) for a in node.args))
  raise ValueError(f"unsupported expression node {type(node).__name__}")


def holds(claim: Claim, results: dict) -> bool | None:
  """Whether `claim` holds on one results dict; None when a key is missing or not a finite number."""
  env = {}
  for i, k in enumerate(claim.keys):
    v = results.get(k)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
      return None
    env[f"_k{i}"] = v
  return bool(_eval(_parse(claim.check, claim.id), env))


def _figure(values: list) -> str:
  vals = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
  if not vals:
    return "-"
  if len(vals) == 1 or min(vals) == max(vals):
    return f"{vals[0]:.4g}"
  return f"{sum(vals) / len(vals):.4g} ({min(vals):.4g} to {max(vals):.4g})"


def verdict(claim: Claim, results_per_seed: list[dict], preset: str) -> dict:
  """The claim's verdict over one or more seeds' results, with the measured figures."""
  ours = {k: _figure([r.get(k) for r in results_per_seed]) for k in claim.keys}
  out = {"id": claim.id, "claim": claim.text, "paper": claim.paper, "check": claim.check, "ours": ours,
         "seeds": len(results_per_seed)}
  if preset not in claim.presets or not results_per_seed:
    return dict(out, verdict=NOT_MEASURABLE)
  each = [holds(claim, r) for r in results_per_seed]
  if any(h is None for h in each):
    return dict(out, verdict=NOT_MEASURABLE)
  if all(each):
    return dict(out, verdict=REPRODUCED)
  if not any(each):
    return dict(out, verdict=NOT_REPRODUCED)
  return dict(out, verdict=f"{UNSTABLE} ({sum(each)} of {len(each)} seeds hold)")
