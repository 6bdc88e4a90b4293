"""Distribution-calibrated aggregation of sampled judge verdicts (Dadkhahi et al., arXiv 2512.03019).

A judge samples n verdicts per item (A better, B better, tie), summarized as counts (n_A, n_B, n_T). The paper
models them with Bradley-Terry-Davidson (BTD): P(A) ∝ pi_A, P(B) ∝ pi_B, P(T) ∝ nu sqrt(pi_A pi_B), with
polarity theta = log(pi_A / pi_B) and decisiveness through nu, calibrated on held-out data, and compares with
majority vote, soft self-consistency and self-aggregation by MAE and pairwise accuracy as n grows.

Math. Dividing by sqrt(pi_A pi_B), (P(A), P(B), P(T)) = softmax(theta/2, -theta/2, log nu), so per item
  l(theta, nu) = (a - b) theta/2 + t log nu - n log(2 cosh(theta/2) + nu),    (a, b, t) = counts, n = a + b + t.
This is a multinomial logit with logits linear in (theta, log nu): jointly concave. Three consequences:
- One item, free nu: the model is saturated, the MLE matches frequencies: theta = log(a/b), nu = t/sqrt(ab)
  (`fit_item`); its rating P(A) + P(T)/2 is then soft self-consistency exactly.
- Shared nu, per-item theta (`fit`): for fixed nu the item's score equation (a - b)(x + 1/x + nu) = n(x - 1/x),
  x = e^(theta/2), is the quadratic (2b + t) x^2 - (a - b) nu x - (2a + t) = 0 with one positive root
  (`theta_given_nu`). Many ties shrink theta at the same margin: polarity and decisiveness both enter.
- The profile log-likelihood in log nu is concave, its derivative sum_i t_i - n_i P_T,i (ties seen minus ties
  expected, by the envelope theorem) is decreasing: bisection finds nu.

Degenerate counts. `prior` alpha (default 0.5) pseudo-counts are added to each outcome of every item: the MAP
under the prior prod_k P_k^alpha, a BTD likelihood again, so the closed forms hold on the augmented counts and
every estimate is finite. One item with alpha = 0.5: all ties (0, 0, n) gives theta = 0, nu = 2n + 1; no ties
(a, b, 0) gives theta = log((a+.5)/(b+.5)), nu = .5/sqrt((a+.5)(b+.5)); n_A = 0 a finite negative theta.
alpha = 0 is the plain MLE: theta = +-inf for one-sided counts (b = t = 0 or a = t = 0), theta = 0 for a = b, the
shared nu is clipped to [e^-20, e^20] (no ties anywhere sends it to the lower end), and `fit_item`'s nu is
t/sqrt(ab) as IEEE gives it (inf, or nan for 0/0).

Ratings and calibration. The paper's: the BTD model on counts, its two readings (polarity, decisiveness),
calibration on held-out data, and (from a summary, 2nd) task-specific calibration parameters giving a calibrated
decision boundary over counts. Ours, where it is silent: ratings live on the preference scale y in [0, 1]
(1: A better, 0.5: tie, 0: B better; a human-consensus mean is allowed; MAE on a [-1, 1] scale is twice ours);
the rating of (theta, nu) is P(A) + P(T)/2, monotone in theta. `calibrate` fits, on the held-out split at the
same n: (1) nu, by the shared-nu MLE over its counts; (2) slope and offset (a temperature and a position-bias
correction) in y ~ rating(slope theta + offset, nu), by least squares (Levenberg-Marquardt, a smooth stand-in
for MAE; a separate ground-truth tie parameter proved nearly redundant with the slope); (3) a tie band:
|rating - 0.5| <= band is a tie verdict, chosen to maximize held-out accuracy (the tie calibration of Deutsch et
al., arXiv 2305.14324). Test items are then fitted one by one in closed form at that nu. Pairwise accuracy is
read per item: each item is a pair, and its three-way verdict is compared with the ground truth's (y = 0.5 is a
tie).

Axes: I items, N samples per item; the last axis of counts is (n_A, n_B, n_T).
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, NamedTuple, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

A, B, TIE, UNPARSED = 0, 1, 2, -1
SCORES = {A: 1.0, B: 0.0, TIE: 0.5, UNPARSED: 0.5}
LOG_NU_RANGE = (-20.0, 20.0)


class Fit(NamedTuple):
  theta: jax.Array  # [I]
  nu: jax.Array     # [] shared, or [I] for fit_item


class Calibration(NamedTuple):
  nu: float         # judge decisiveness (shared-nu MLE on the held-out split)
  slope: float      # theta -> slope * theta + offset
  offset: float
  tie_band: float   # |rating - 0.5| <= tie_band is a tie verdict


class SelfAggregator(Protocol):
  """The judge reading its own samples: per item, one final verdict code (A, B, TIE, or UNPARSED)."""

  def __call__(self, items: Sequence[Any], samples: Sequence[Sequence[Any]]) -> Sequence[int]: ...


def _counts_3(counts, prior):
  counts = jnp.asarray(counts, jnp.float32)
  if counts.shape[-1:] != (3,):
    raise ValueError(f"counts must end in an axis of 3 (n_A, n_B, n_T), found shape {counts.shape}")
  if prior < 0:
    raise ValueError(f"prior must be >= 0, found {prior}")
  return counts + prior


@jax.jit
def counts(verdicts_IN) -> jax.Array:
  """[I, N] verdict codes -> [I, 3] float counts (n_A, n_B, n_T); UNPARSED (or any other code) is not counted."""
  v = jnp.asarray(verdicts_IN)
  return jnp.stack([(v == k).sum(-1) for k in (A, B, TIE)], -1).astype(jnp.float32)


def probabilities(theta, nu) -> jax.Array:
  """[..., 3] (P(A), P(B), P(T)) of BTD with polarity theta and tie parameter nu."""
  theta = jnp.clip(jnp.asarray(theta, jnp.float32), -1e4, 1e4)
  nu = jnp.broadcast_to(jnp.asarray(nu, jnp.float32), theta.shape)
  return jax.nn.softmax(jnp.stack([theta / 2, -theta / 2, jnp.log(nu)], -1), -1)


@jax.jit
def rating(theta, nu) -> jax.Array:
  """The preference score P(A) + P(T)/2 in [0, 1]."""
  p = probabilities(theta, nu)
  return p[..., 0] + p[..., 2] / 2


def log_likelihood(theta_I, nu, counts_I3) -> jax.Array:
  """Sum over items of the multinomial log-likelihood (without the constant multinomial coefficient)."""
  p = probabilities(theta_I, nu)
  return jnp.sum(jnp.where(counts_I3 > 0, counts_I3 * jnp.log(p), 0.0))


@jax.jit
def _theta_given_nu(c, nu):
  a, b, t = c[..., 0], c[..., 1], c[..., 2]
  m, lo, hi = jnp.abs(a - b), jnp.minimum(a, b), jnp.maximum(a, b)
  # The root x = (m nu + sqrt(m^2 nu^2 + 4 (2hi + t)(2lo + t))) / (2 (2lo + t)) taken for the larger count
  # has no cancellation; theta(a, b) = -theta(b, a).
  root = m * nu + jnp.sqrt((m * nu) ** 2 + 4 * (2 * hi + t) * (2 * lo + t))
  theta = jnp.sign(a - b) * 2 * (jnp.log(root) - jnp.log(2 * (2 * lo + t)))
  return jnp.where(a == b, 0.0, theta)


def theta_given_nu(counts_I3, nu, prior: float = 0.5) -> jax.Array:
  """[I] per-item MAP polarity for a given (shared or per-item) nu, in closed form."""
  return _theta_given_nu(_counts_3(counts_I3, prior), jnp.asarray(nu, jnp.float32))


def fit_item(counts_I3, prior: float = 0.5) -> Fit:
  """Per-item theta and nu (saturated model): theta = log(a/b), nu = t/sqrt(ab) on the augmented counts."""
  c = _counts_3(counts_I3, prior)
  a, b, t = c[..., 0], c[..., 1], c[..., 2]
  return Fit(jnp.where(a == b, 0.0, jnp.log(a) - jnp.log(b)), t / jnp.sqrt(a * b))


@jax.jit
def _fit_shared(c):
  n = c.sum(-1)

  def score(log_nu):  # d/d(log nu) of the profile log-likelihood: ties seen minus ties expected
    p_tie = probabilities(_theta_given_nu(c, jnp.exp(log_nu)), jnp.exp(log_nu))[..., 2]
    return jnp.sum(c[..., 2]) - jnp.sum(n * p_tie)

  def step(_, bracket):
    lo, hi = bracket
    mid = (lo + hi) / 2
    up = score(mid) > 0
    return jnp.where(up, mid, lo), jnp.where(up, hi, mid)

  lo, hi = jax.lax.fori_loop(0, 48, step, (jnp.float32(LOG_NU_RANGE[0]), jnp.float32(LOG_NU_RANGE[1])))
  nu = jnp.exp((lo + hi) / 2)
  return Fit(_theta_given_nu(c, nu), nu)


def fit(counts_I3, prior: float = 0.5) -> Fit:
  """Per-item theta and one shared nu by maximum likelihood (MAP with `prior` pseudo-counts); see the module doc."""
  c = _counts_3(counts_I3, prior)
  if c.ndim != 2:
    raise ValueError(f"fit takes counts [I, 3], found shape {c.shape}")
  return _fit_shared(c)


@jax.jit
def _fit_map(theta_I, y_I, nu):
  def residual(p):
    return rating(p[0] * theta_I + p[1], nu) - y_I

  def step(_, state):
    p, lam, loss = state
    r, jac = residual(p), jax.jacfwd(residual)(p)
    h = jac.T @ jac
    delta = jnp.linalg.solve(h + lam * (jnp.diag(jnp.diag(h)) + 1e-6 * jnp.eye(2)), -jac.T @ r)
    new_loss = jnp.sum(residual(p + delta) ** 2)
    better = new_loss < loss
    return (jnp.where(better, p + delta, p), jnp.where(better, lam / 3, lam * 3), jnp.minimum(new_loss, loss))

  p0 = jnp.array([1.0, 0.0], jnp.float32)
  p, _, _ = jax.lax.fori_loop(0, 100, step, (p0, jnp.float32(1e-2), jnp.sum(residual(p0) ** 2)))
  return p


def calibrate(counts_I3, y_I, prior: float = 0.5) -> Calibration:
  """Fits nu, the theta -> rating map and the tie band on a held-out split (see the module doc).

  Args:
    counts_I3: the held-out items' judge counts.
    y_I: their ground-truth ratings in [0, 1].
    prior: pseudo-counts per outcome; must be > 0 here so that every theta is finite.
  """
  if prior <= 0:
    raise ValueError(f"calibrate needs prior > 0 (finite theta for every item), found {prior}")
  y = jnp.asarray(y_I, jnp.float32)
  judge = fit(counts_I3, prior)
  if y.shape != judge.theta.shape:
    raise ValueError(f"y_I must have one rating per item, shape {judge.theta.shape}, found {y.shape}")
  slope, offset = (float(v) for v in _fit_map(judge.theta, y, judge.nu))
  cal = Calibration(float(judge.nu), slope, offset, 0.0)
  return cal._replace(tie_band=tie_band(predict(counts_I3, cal, prior), y))


def predict(counts_I3, cal: Calibration, prior: float = 0.5) -> jax.Array:
  """[I] calibrated ratings of test items: per-item theta at the calibrated nu, then the fitted map."""
  theta = theta_given_nu(counts_I3, cal.nu, prior)
  return rating(cal.slope * theta + cal.offset, cal.nu)


@functools.partial(jax.jit, static_argnames="n")
def simulate_verdicts(key, theta_I, nu, n: int) -> jax.Array:
  """[I, n] verdict codes drawn i.i.d. from BTD(theta_i, nu) for each item."""
  cdf = jnp.cumsum(probabilities(theta_I, nu), -1)[:, None, :]
  u = jax.random.uniform(key, (cdf.shape[0], n, 1))
  return (u >= cdf[..., :2]).sum(-1).astype(jnp.int32)  # A below P(A), B up to P(A) + P(B), else TIE


# Baselines, on the same [0, 1] preference scale.

def majority_vote(counts_I3) -> jax.Array:
  """1 (A) or 0 (B) for a strict plurality; any tie for first place, a plurality of ties, or n = 0: 0.5."""
  a, b, t = (jnp.asarray(counts_I3, jnp.float32)[..., k] for k in range(3))
  return jnp.where((a > b) & (a > t), 1.0, jnp.where((b > a) & (b > t), 0.0, 0.5))


def soft_self_consistency(counts_I3) -> jax.Array:
  """Mean sample score with ties as 0.5: (n_A + n_T/2) / n; 0.5 for n = 0."""
  c = jnp.asarray(counts_I3, jnp.float32)
  n = c.sum(-1)
  return jnp.where(n > 0, (c[..., 0] + c[..., 2] / 2) / jnp.maximum(n, 1), 0.5)


def self_aggregation(aggregator: SelfAggregator, items: Sequence[Any], samples: Sequence[Sequence[Any]]) -> np.ndarray:
  """[I] scores of the judge's own final verdicts over its samples; UNPARSED counts as a tie (0.5)."""
  codes = list(aggregator(items, samples))
  if len(codes) != len(items):
    raise ValueError(f"the self-aggregator must return one verdict per item: {len(items)}, found {len(codes)}")
  bad = [c for c in codes if c not in SCORES]
  if bad:
    raise ValueError(f"verdict codes must be in {sorted(SCORES)}, found {bad[:5]}")
  return np.array([SCORES[c] for c in codes], np.float32)


# Metrics.

def verdicts(scores_I, band: float = 0.0) -> np.ndarray:
  """[I] verdict codes of ratings: A above 0.5 + band, B below 0.5 - band, else TIE."""
  d = np.asarray(scores_I, np.float64) - 0.5
  return np.where(d > band, A, np.where(d < -band, B, TIE))


def tie_band(scores_I, y_I) -> float:
  """The smallest band maximizing held-out verdict accuracy; candidates 0 and each |score - 0.5| (O(I^2))."""
  scores = np.asarray(scores_I, np.float64)
  truth = verdicts(y_I)
  bands = np.concatenate([[0.0], np.unique(np.abs(scores - 0.5))])
  acc = [(verdicts(scores, b) == truth).mean() for b in bands]
  return float(bands[int(np.argmax(acc))])


def mae(scores_I, y_I) -> float:
  return float(np.mean(np.abs(np.asarray(scores_I, np.float64) - np.asarray(y_I, np.float64))))


def pairwise_accuracy(scores_I, y_I, band: float = 0.0) -> float:
  """Share of items whose three-way verdict (ratings within `band` of 0.5 are ties) equals the ground truth's."""
  return float(np.mean(verdicts(scores_I, band) == verdicts(y_I)))


def evaluate(verdicts_cal_IN, y_cal, verdicts_test_IN, y_test, ns: Sequence[int], *, prior: float = 0.5,
             self_scores: Mapping[int, Any] | None = None) -> list[dict]:
  """MAE and pairwise accuracy of every method at each n (the first n samples of each item).

  Methods: "majority", "soft_sc" (tie band calibrated), "btd_raw" (rating(theta, nu) at the held-out nu, tie band
  calibrated), "btd" (`calibrate` + `predict`), and "self_aggregation" where `self_scores[n]` gives the test
  items' `self_aggregation` scores at that n. Calibration uses the held-out split at the same n.

  Returns:
    One row per (method, n): {"method", "n", "mae", "pairwise_accuracy"}, and per test item its "abs_error" and
    whether its verdict is "right" (whose means those are: the claims' paired intervals).
  """
  y_cal, y_test = np.asarray(y_cal), np.asarray(y_test)
  rows = []
  for n in ns:
    c_cal, c_test = counts(np.asarray(verdicts_cal_IN)[:, :n]), counts(np.asarray(verdicts_test_IN)[:, :n])
    cal = calibrate(c_cal, y_cal, prior)
    raw = lambda c, cal=cal: rating(theta_given_nu(c, cal.nu, prior), cal.nu)
    methods = {
        "majority": (majority_vote(c_test), 0.0),
        "soft_sc": (soft_self_consistency(c_test), tie_band(soft_self_consistency(c_cal), y_cal)),
        "btd_raw": (raw(c_test), tie_band(raw(c_cal), y_cal)),
        "btd": (predict(c_test, cal, prior), cal.tie_band),
    }
    if self_scores is not None and n in self_scores:
      methods["self_aggregation"] = (self_scores[n], 0.0)
    for name, (scores, band) in methods.items():
      err = np.abs(np.asarray(scores, np.float64) - y_test.astype(np.float64))
      right = verdicts(scores, band) == verdicts(y_test)
      rows.append({"method": name, "n": int(n), "mae": mae(scores, y_test),
                   "pairwise_accuracy": pairwise_accuracy(scores, y_test, band),
                   "abs_error": err.tolist(), "right": right.astype(np.float64).tolist()})
  return rows
