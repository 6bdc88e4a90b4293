"""The papers' claims as data, and their verdicts computed from results.json (and per-item scores) only.

Each experiment declares `Claim`s: an id, the claim in one line, the paper's own figure, a check over its
results.json keys, and the presets it applies to. A check is an expression over `{key}` references
(`"{val_loss.scale} < {val_loss.galore}"`), evaluated with arithmetic, comparisons, `and`/`or`/`not`,
`abs`/`min`/`max` and nothing else. A claim also states when its comparison can tell anything (`measurable`, an
expression of the same kind: the compared figures off their floor and ceiling, the base rate above chance, enough
items); where that fails the verdict is "not measurable at this preset: <why> (<the figures>)".

With `diff=(A, B)` and the run's per-item scores of A and B (items.json, see `registry`), the verdict comes from a
95% bootstrap interval of mean(A) - mean(B) over the items, seeds pooled (and resampled: `bootstrap`): reproduced
when the interval lies above `effect`, not reproduced when it lies at or below it, otherwise "inconclusive
(n=...)". "A beats each of B and C" declares the pairs `diff=((A, B), (A, C))`: reproduced when every interval lies
above `effect`, not reproduced when one lies at or below it (each pair tested at 95%, their intersection needs no multiple-comparison correction). The
part of a compound claim no interval covers ("at no more LLM calls") is its `given` rule: where it fails on every
seed the claim is not reproduced whatever the intervals say. "A changes B by less than w" declares `within=w`:
reproduced when the interval lies inside (-w, w), not reproduced when it lies wholly outside. A ratio claim ("A at
most half of B") scales the arrays: `scale=(0.5, 1)` with `diff=(B, A)` judges 0.5 B - A. Without per-item scores,
over several seeds a claim is reproduced or not reproduced when every seed agrees, and unstable (with the spread
of its keys) when they do not; with them, unstable when one seed's own interval reproduces the claim and another's
refutes it (the pooled interval counts items, not the training runs that made them).

A `Check` is a harness self-check (the benchmark's references behave as designed, a constructed-wrong agent scores
low): judged the same way, worded "passed" / "failed", and reported apart from the paper's claims.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import operator
import re

import numpy as np

# The nineteen papers: short name -> title.
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
SKIPPED = "skipped"  # a tool or package the experiment needs is not installed: "skipped (bubblewrap not installed)"
INCONCLUSIVE = "inconclusive"  # the 95% interval holds both the claimed effect and values against it
PASSED, CHECK_FAILED = "passed", "failed"  # a Check's words for reproduced / not reproduced
NO_ITEMS = "(no interval: per-item scores not recorded)"
NO_DIFF = "(no interval: no per-item difference declared)"
RESAMPLES, LEVEL = 2000, 0.95  # the bootstrap's resamples (RNG seed 0: the verdict is deterministic) and coverage
_KEY = re.compile(r"\{([^{}]+)\}")


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim of a paper, checkable on results.json.

  Attributes:
    id: short identifier, unique within the experiment (its claims and checks together).
    text: the claim in one line.
    paper: the paper's figure for it, as the paper states it.
    check: expression over `{results key}` references that is true when the claim holds.
    presets: the presets whose scale the claim applies to (elsewhere: not measurable at this preset).
    measurable: expression (same language) true when the comparison can tell anything; "" when it always can.
    why: what a failed `measurable` means, in a few words (the verdict adds the figures); required with it.
    diff: (A, B), the per-item score arrays (names in items.json) whose mean difference A - B the check
      compares; name the side the claim favours first (for lower-is-better scores, the baseline first). Several
      pairs ((A, B), (A, C)) for a claim that A beats each of B and C.
    effect: the claimed difference: reproduced when the interval of A - B lies above it, not reproduced when
      it lies at or below it (0: "A beats B"; -0.01: "A loses less than 0.01").
    scale: (a, b), the factors of the difference: the interval is of a mean(A) - b mean(B) (a ratio claim, "A is
      at least 1.5x B": diff=(A, B), scale=(1, 1.5)).
    within: a two-sided claim, "A and B differ by less than `within`" (with one diff pair; 0: none): reproduced
      when the interval lies inside (-within, within), not reproduced when it lies at or beyond either end.
    given: the rest of a compound claim, which the intervals do not cover (same language as `check`; "" when
      none): with intervals, not reproduced where it fails on every seed, unstable where the seeds disagree.
  """
  id: str
  text: str
  paper: str
  check: str
  presets: tuple[str, ...] = ("cpu", "full")
  measurable: str = ""
  why: str = ""
  diff: tuple[str, str] | tuple[tuple[str, str], ...] | None = None
  effect: float = 0.0
  scale: tuple[float, float] = (1.0, 1.0)
  within: float = 0.0
  given: str = ""

  def __post_init__(self):
    if not self.keys:
      raise ValueError(f"claim {self.id!r}: check {self.check!r} names no {{results key}}")
    _parse(self.check, self.id)  # fails now, at registration, on a malformed check
    if self.measurable:
      if not self.measurable_keys:
        raise ValueError(f"claim {self.id!r}: measurable {self.measurable!r} names no {{results key}}")
      _parse(self.measurable, self.id)
      if not self.why:
        raise ValueError(f"claim {self.id!r}: a measurable condition needs its why")
    if self.diff is not None and not (self.pairs and all(
        len(p) == 2 and all(isinstance(d, str) and d for d in p) and p[0] != p[1] for p in self.pairs)):
      raise ValueError(f"claim {self.id!r}: diff must name two different per-item arrays, or pairs of them, "
                       f"found {self.diff!r}")
    if self.given:
      if self.diff is None or not _KEY.findall(self.given):
        raise ValueError(f"claim {self.id!r}: given {self.given!r} needs a diff and a {{results key}}")
      _parse(self.given, self.id)
    if self.within and not (self.within > 0 and math.isfinite(self.within) and len(self.pairs) == 1
                            and not self.effect):
      raise ValueError(f"claim {self.id!r}: within must be a positive number with one diff pair and no effect, "
                       f"found within={self.within}, diff={self.diff!r}, effect={self.effect}")
    if len(self.scale) != 2 or not all(isinstance(f, (int, float)) and math.isfinite(f) and f > 0 for f in self.scale):
      raise ValueError(f"claim {self.id!r}: scale must be two positive numbers, found {self.scale!r}")
    if not math.isfinite(self.effect):
      raise ValueError(f"claim {self.id!r}: effect must be finite, found {self.effect}")

  @property
  def pairs(self) -> tuple[tuple[str, ...], ...]:
    """The (A, B) pairs of `diff`; () without one."""
    if not self.diff:
      return ()
    return (tuple(self.diff),) if isinstance(self.diff[0], str) else tuple(tuple(p) for p in self.diff)

  @property
  def keys(self) -> tuple[str, ...]:
    """The results keys the check reads."""
    return tuple(dict.fromkeys(_KEY.findall(self.check)))

  @property
  def measurable_keys(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys(_KEY.findall(self.measurable)))

  @property
  def all_keys(self) -> tuple[str, ...]:
    """The results keys of the check, then those only `measurable` or `given` read."""
    return tuple(dict.fromkeys(self.keys + self.measurable_keys + tuple(_KEY.findall(self.given))))


@dataclasses.dataclass(frozen=True)
class Check(Claim):
  """A harness self-check (the benchmark's references behave as designed, a constructed-wrong agent scores low),
  declared in `Experiment.checks`: judged like a claim, "passed" / "failed", never counted as a paper claim."""


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


def _finite(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _holds(expr: str, claim_id: str, results: dict) -> bool | None:
  env = {}
  for i, k in enumerate(dict.fromkeys(_KEY.findall(expr))):
    if not _finite(results.get(k)):
      return None
    env[f"_k{i}"] = results[k]
  return bool(_eval(_parse(expr, claim_id), env))


def holds(claim: Claim, results: dict) -> bool | None:
  """Whether `claim` holds on one results dict; None when a key is missing or not a finite number."""
  return _holds(claim.check, claim.id, results)


def measurable(claim: Claim, results: dict) -> bool | None:
  """Whether `claim`'s comparison can tell anything on one results dict (True without a condition); None when a
  key of the condition is missing or not a finite number."""
  return _holds(claim.measurable, claim.id, results) if claim.measurable else True


def kind(verdict_text: str) -> str:
  """A verdict's kind, without its details: "not measurable at this preset: ..." -> "not measurable at this
  preset", "inconclusive (n=48)" -> "inconclusive"."""
  return verdict_text.split(": ")[0].split(" (")[0]


def _figure(values: list) -> str:
  vals = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
  if not vals:
    return "-"
  if len(vals) == 1 or min(vals) == max(vals):
    return f"{vals[0]:.4g}"
  return f"{sum(vals) / len(vals):.4g} ({min(vals):.4g} to {max(vals):.4g})"


def _scores(values) -> np.ndarray | None:
  try:
    a = np.asarray(values, np.float64)
  except (TypeError, ValueError):
    return None
  return a if a.ndim == 1 and a.size and np.isfinite(a).all() else None


def bootstrap(a_per_seed: list, b_per_seed: list, resamples: int = RESAMPLES, level: float = LEVEL) -> dict:
  """The percentile bootstrap interval of mean(A) - mean(B), the seeds' items pooled.

  Two levels over several seeds: each resample draws as many seeds with replacement, then each drawn seed's items,
  so a training run's own noise widens the interval as much as its items' (one seed: its items alone). Paired
  (items resampled together) when every seed gives A and B the same number of items, else A's and B's items are
  resampled independently. The RNG seed is fixed: the same scores give the same interval.

  Returns:
    {"mean", "low", "high", "n" (items of A, pooled), "n_b", "paired", "seeds"}.
  """
  a, b = np.concatenate(a_per_seed), np.concatenate(b_per_seed)
  paired = all(len(x) == len(y) for x, y in zip(a_per_seed, b_per_seed))
  k, rng = len(a_per_seed), np.random.default_rng(0)
  picks = rng.integers(0, k, (resamples, k)) if k > 1 else np.zeros((resamples, 1), np.int64)
  sides = ([[np.asarray(x, np.float64) - y for x, y in zip(a_per_seed, b_per_seed)]] if paired
           else [[np.asarray(x, np.float64) for x in per_seed] for per_seed in (a_per_seed, b_per_seed)])
  sums, counts = np.zeros((len(sides), resamples)), np.zeros((len(sides), resamples))
  for j in range(picks.shape[1]):
    for s in range(k):
      rows = np.flatnonzero(picks[:, j] == s)
      chunk = max(1, 4_000_000 // max(len(side[s]) for side in sides))  # bounds the index arrays' memory
      for start in range(0, len(rows), chunk):
        at = rows[start:start + chunk]
        for i, side in enumerate(sides):
          x = side[s]
          sums[i, at] += x[rng.integers(0, len(x), (len(at), len(x)))].sum(axis=1)
          counts[i, at] += len(x)
  means = sums / counts
  tail = 100 * (1 - level) / 2
  low, high = np.percentile(means[0] if paired else means[0] - means[1], [tail, 100 - tail])
  return {"mean": float(a.mean() - b.mean()), "low": float(low), "high": float(high), "n": int(len(a)),
          "n_b": int(len(b)), "paired": paired, "seeds": k}


def _intervals(claim: Claim, items_per_seed: list[dict] | None) -> list[dict] | None:
  """The bootstrap interval of each of the claim's diff pairs over the seeds' per-item scores; None when any
  score array is missing."""
  if claim.diff is None or not items_per_seed:
    return None
  out = []
  for pair in claim.pairs:
    arrays = [[_scores((items or {}).get(name)) for items in items_per_seed] for name in pair]
    if any(x is None for side in arrays for x in side):
      return None
    out.append(bootstrap(*([f * x for x in side] for f, side in zip(claim.scale, arrays))))
  return out


def _n(iv: dict) -> str:
  return f"n={iv['n']}" + ("" if iv["paired"] else f" vs {iv['n_b']}")


def _describe(claim: Claim, pair: tuple[str, ...], iv: dict) -> str:
  a, b = (f"{f:g} {name}" if f != 1 else name for f, name in zip(claim.scale, pair))
  return (f"{a} - {b} = {iv['mean']:.4g}, {LEVEL:.0%} interval [{iv['low']:.4g}, "
          f"{iv['high']:.4g}] ({_n(iv)}, {'paired' if iv['paired'] else 'unpaired'}, bootstrap over "
          f"{'seeds and ' if iv['seeds'] > 1 else ''}items)")


def _interval_verdict(claim: Claim, ivs: list[dict]) -> str:
  """Reproduced, not reproduced or "inconclusive (n=...)" by the intervals of the claim's pairs (`effect`,
  `within`)."""
  if claim.within:
    (iv,) = ivs
    if -claim.within < iv["low"] and iv["high"] < claim.within:
      return REPRODUCED
    if iv["low"] >= claim.within or iv["high"] <= -claim.within:
      return NOT_REPRODUCED
  elif all(iv["low"] > claim.effect for iv in ivs):
    return REPRODUCED
  elif any(iv["high"] <= claim.effect for iv in ivs):
    return NOT_REPRODUCED
  return f"{INCONCLUSIVE} ({', '.join(dict.fromkeys(_n(iv) for iv in ivs))})"


def _worded(claim: Claim, v: str) -> str:
  if isinstance(claim, Check):
    return {REPRODUCED: PASSED, NOT_REPRODUCED: CHECK_FAILED}.get(v, v)
  return v


def verdict(claim: Claim, results_per_seed: list[dict], preset: str,
            items_per_seed: list[dict] | None = None) -> dict:
  """The claim's verdict over one or more seeds' results (and their per-item scores), with the measured figures.

  In order: not measurable (the preset is not the claim's, a key has no finite value, or `measurable` fails on
  a seed, with its why and figures); with `diff` and per-item scores of every seed, the interval's verdict
  (field `interval` says it); else the rule's verdict over the seeds (`interval` says why there is none).
  """
  ours = {k: _figure([r.get(k) for r in results_per_seed]) for k in claim.all_keys}
  out = {"id": claim.id, "claim": claim.text, "paper": claim.paper, "check": claim.check, "ours": ours,
         "seeds": len(results_per_seed), "interval": NO_DIFF if claim.diff is None else NO_ITEMS}
  if claim.measurable:
    out["measurable"] = claim.measurable
  if preset not in claim.presets or not results_per_seed:
    return dict(out, verdict=NOT_MEASURABLE)
  each = [holds(claim, r) for r in results_per_seed]
  able = [measurable(claim, r) for r in results_per_seed]
  if any(h is None for h in each) or any(m is None for m in able):
    lacking = [k for k in claim.all_keys if not all(_finite(r.get(k)) for r in results_per_seed)]
    return dict(out, verdict=f"{NOT_MEASURABLE}: no finite value of {', '.join(lacking)} in the results")
  if not all(able):
    figures = ", ".join(f"{k}={ours[k]}" for k in claim.measurable_keys)
    return dict(out, verdict=f"{NOT_MEASURABLE}: {claim.why} ({figures})")
  ivs = _intervals(claim, items_per_seed)
  if ivs is not None:
    out.update(interval="; ".join(_describe(claim, p, iv) for p, iv in zip(claim.pairs, ivs)),
               interval_bounds=[[iv["low"], iv["high"]] for iv in ivs])
    if claim.given:
      out["given"] = claim.given
      rest = [_holds(claim.given, claim.id, r) for r in results_per_seed]
      if not any(rest):
        return dict(out, verdict=_worded(claim, NOT_REPRODUCED))
      if not all(rest):
        return dict(out, verdict=f"{UNSTABLE} ({sum(map(bool, rest))} of {len(rest)} seeds hold {claim.given})")
    pooled = _interval_verdict(claim, ivs)
    if len(items_per_seed) > 1:  # seeds whose own intervals contradict each other: training noise dominates
      own = [_interval_verdict(claim, _intervals(claim, [items])) for items in items_per_seed]
      if REPRODUCED in own and NOT_REPRODUCED in own:
        return dict(out, verdict=f"{UNSTABLE} ({own.count(REPRODUCED)} of {len(own)} seeds reproduced, "
                                 f"{own.count(NOT_REPRODUCED)} not, each by its own interval)")
    return dict(out, verdict=pooled if kind(pooled) == INCONCLUSIVE else _worded(claim, pooled))
  if all(each):
    return dict(out, verdict=_worded(claim, REPRODUCED))
  if not any(each):
    return dict(out, verdict=_worded(claim, NOT_REPRODUCED))
  return dict(out, verdict=f"{UNSTABLE} ({sum(each)} of {len(each)} seeds hold)")
