"""BTD aggregation (arXiv 2512.03019): closed forms, scipy as the MLE oracle, recovery as n grows, degenerate counts,
baselines and metrics (scikit-learn as the oracle)."""
import itertools

import jax
import numpy as np
import pytest
from scipy import optimize, special
from sklearn import metrics

from experiments.btd import aggregation as btd


def _nll(theta_I, log_nu, counts_I3):
  """The BTD negative log-likelihood written independently: logits (theta/2, -theta/2, log nu)."""
  logits = np.stack([theta_I / 2, -theta_I / 2, np.full_like(theta_I, log_nu)], -1)
  return -np.sum(counts_I3 * (logits - special.logsumexp(logits, -1, keepdims=True)))


def _random_counts(seed, items, n_max=30, positive=True):
  rng = np.random.default_rng(seed)
  return rng.integers(1 if positive else 0, n_max, size=(items, 3)).astype(np.float64)


@pytest.mark.parametrize("a,b,t", [(6, 3, 2), (1, 7, 5), (4, 4, 1), (20, 1, 30)])
def test_single_item_mle_is_the_closed_form(a, b, t):
  c = np.array([[a, b, t]], np.float32)
  shared, item = btd.fit(c, prior=0.0), btd.fit_item(c, prior=0.0)
  np.testing.assert_allclose(shared.theta, [np.log(a / b)], atol=2e-5)
  np.testing.assert_allclose(item.theta, [np.log(a / b)], atol=1e-6)
  np.testing.assert_allclose(shared.nu, t / np.sqrt(a * b), rtol=2e-5)
  np.testing.assert_allclose(item.nu, [t / np.sqrt(a * b)], rtol=1e-6)
  # The saturated model reproduces the frequencies, so its rating is soft self-consistency.
  np.testing.assert_allclose(btd.rating(item.theta, item.nu), btd.soft_self_consistency(c), atol=1e-6)


def test_log_likelihood_matches_the_independent_nll():
  c = _random_counts(0, 9, positive=False)
  theta = np.random.default_rng(1).normal(size=9)
  np.testing.assert_allclose(-btd.log_likelihood(theta, 0.7, c), _nll(theta, np.log(0.7), c), rtol=1e-5)


@pytest.mark.parametrize("nu", [0.05, 0.8, 6.0])
def test_theta_given_nu_matches_scipy(nu):
  c = _random_counts(2, 16, positive=False)
  got = btd.theta_given_nu(c, nu, prior=0.5)
  for i, ci in enumerate(c + 0.5):
    ref = optimize.minimize_scalar(lambda th, ci=ci: _nll(np.array([th]), np.log(nu), ci[None]), bounds=(-30, 30),
                                   method="bounded", options={"xatol": 1e-9})
    np.testing.assert_allclose(got[i], ref.x, atol=1e-4)
  # Decisiveness: at the same margin among non-ties, more ties mean a smaller polarity.
  many_ties = btd.theta_given_nu(np.array([[6, 4, 0], [6, 4, 10], [6, 4, 90]]), nu)
  assert many_ties[0] > many_ties[1] > many_ties[2] > 0


@pytest.mark.parametrize("prior,positive", [(0.0, True), (0.5, False)])
def test_shared_nu_fit_matches_scipy(prior, positive):
  c = _random_counts(3, 12, positive=positive)
  got = btd.fit(c, prior=prior)
  ca = c + prior
  ref = optimize.minimize(lambda p: _nll(p[:-1], p[-1], ca), np.zeros(13), method="BFGS", options={"gtol": 1e-9})
  np.testing.assert_allclose(got.theta, ref.x[:-1], atol=1e-3)
  np.testing.assert_allclose(np.log(got.nu), ref.x[-1], atol=1e-3)
  assert -btd.log_likelihood(got.theta, got.nu, ca) <= ref.fun + 1e-3


def test_simulated_parameters_are_recovered_as_n_grows():
  theta = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (300,))) * 1.5
  nu = 0.8
  theta_err, nu_err = [], []
  for n in (8, 64, 512):
    f = btd.fit(btd.counts(btd.simulate_verdicts(jax.random.PRNGKey(n), theta, nu, n)))
    theta_err.append(float(np.mean(np.abs(f.theta - theta))))
    nu_err.append(abs(float(np.log(f.nu / nu))))
  assert theta_err[0] > theta_err[1] > theta_err[2], theta_err
  assert theta_err[2] < 0.15 and nu_err[2] < 0.03 and nu_err[2] < nu_err[0], (theta_err, nu_err)


def test_simulated_frequencies_match_the_model():
  v = btd.simulate_verdicts(jax.random.PRNGKey(1), np.array([1.0, -2.0]), 0.5, 20000)
  freq = np.asarray(btd.counts(v)) / 20000
  np.testing.assert_allclose(freq, btd.probabilities(np.array([1.0, -2.0]), 0.5), atol=0.015)


def test_degenerate_counts_give_the_documented_finite_answers():
  n = 8
  all_ties, no_ties, no_a = np.array([[0, 0, n]]), np.array([[5, 3, 0]]), np.array([[0, 6, 2]])
  f = btd.fit(all_ties)
  assert float(f.theta[0]) == 0.0 and f.nu == pytest.approx(2 * n + 1, rel=1e-4)
  f = btd.fit(no_ties)
  assert f.theta[0] == pytest.approx(np.log(5.5 / 3.5), abs=1e-5)
  assert f.nu == pytest.approx(0.5 / np.sqrt(5.5 * 3.5), rel=1e-4)
  f = btd.fit(no_a)
  assert f.theta[0] == pytest.approx(np.log(0.5 / 6.5), abs=1e-5) and f.theta[0] < 0
  # A batch of them, shared nu: everything finite, ties-only items at theta 0, and the same for one-sided items.
  batch = np.array([[0, 0, n], [5, 3, 0], [0, 6, 2], [0, n, 0], [n, 0, 0], [0, 0, 0]])
  f = btd.fit(batch)
  assert np.all(np.isfinite(f.theta)) and np.isfinite(f.nu) and f.nu > 0
  assert f.theta[0] == 0 and f.theta[5] == 0 and f.theta[3] < f.theta[2] < 0 < f.theta[4]
  assert np.isfinite(btd.fit(np.tile(all_ties, (4, 1))).nu) and np.all(btd.fit(np.tile(all_ties, (4, 1))).theta == 0)
  assert 0 < btd.fit(np.tile(no_ties, (4, 1))).nu < 0.2
  # prior = 0 is the plain MLE: infinite polarity for one-sided counts, nu clipped when there are no ties.
  f = btd.fit(np.array([[n, 0, 0], [3, 3, 0], [2, 5, 0]]), prior=0.0)
  assert f.theta[0] == np.inf and f.theta[1] == 0 and np.isfinite(f.theta[2])
  assert f.nu == pytest.approx(np.exp(btd.LOG_NU_RANGE[0]), rel=1e-3)
  for baseline in (btd.majority_vote, btd.soft_self_consistency):
    assert float(baseline(np.zeros((1, 3)))[0]) == 0.5


def test_majority_vote_tie_rule_and_soft_self_consistency():
  c = np.array(list(itertools.product(range(5), repeat=3)), np.float32)

  def rule(a, b, t):
    top = max(a, b, t)
    return 1.0 if a == top > max(b, t) else 0.0 if b == top > max(a, t) else 0.5

  np.testing.assert_array_equal(btd.majority_vote(c), [rule(*ci) for ci in c])
  n = c.sum(-1)
  soft = np.where(n > 0, (c[:, 0] + c[:, 2] / 2) / np.maximum(n, 1), 0.5)
  np.testing.assert_allclose(btd.soft_self_consistency(c), soft)


def test_self_aggregation_interface_with_a_test_double():
  items = ["q0", "q1", "q2", "q3"]
  samples = [[btd.A, btd.A, btd.B], [btd.B, btd.TIE, btd.B], [btd.A, btd.B, btd.TIE], [btd.UNPARSED]]
  seen = {}

  def judge_reads_its_samples(its, smp):  # stands in for the judge model prompted with its own samples
    seen["items"], seen["samples"] = its, smp
    m = btd.majority_vote(btd.counts(np.array([s + [btd.UNPARSED] * (3 - len(s)) for s in smp])))
    return [btd.A if x == 1 else btd.B if x == 0 else (btd.UNPARSED if len(s) == 1 else btd.TIE)
            for x, s in zip(np.asarray(m), smp)]

  got = btd.self_aggregation(judge_reads_its_samples, items, samples)
  np.testing.assert_array_equal(got, [1.0, 0.0, 0.5, 0.5])
  assert seen == {"items": items, "samples": samples}
  with pytest.raises(ValueError, match="one verdict per item"):
    btd.self_aggregation(lambda its, smp: [btd.A], items, samples)
  with pytest.raises(ValueError, match="verdict codes"):
    btd.self_aggregation(lambda its, smp: ["A"] * 4, items, samples)


def test_metrics_match_scikit_learn():
  rng = np.random.default_rng(4)
  y = np.round(rng.uniform(size=200) * 4) / 4  # a 5-point scale, so the ground truth has exact ties
  s = np.clip(y + rng.normal(scale=0.2, size=200), 0, 1)
  assert btd.mae(s, y) == pytest.approx(metrics.mean_absolute_error(y, s), rel=1e-12)
  lab = lambda x, band: np.select([x - 0.5 > band, 0.5 - x > band], ["A", "B"], "tie")
  for band in (0.0, 0.1):
    assert btd.pairwise_accuracy(s, y, band) == pytest.approx(metrics.accuracy_score(lab(y, 0), lab(s, band)))
  best = btd.tie_band(s, y)
  grid = np.linspace(0, 0.5, 2001)
  assert btd.pairwise_accuracy(s, y, best) >= max(metrics.accuracy_score(lab(y, 0), lab(s, g)) for g in grid) - 1e-12


def test_calibration_recovers_the_rating_map_and_beats_the_baselines():
  theta = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (400,))) * 1.5
  v = np.asarray(btd.simulate_verdicts(jax.random.PRNGKey(3), theta, 0.8, 512))
  y = np.asarray(btd.rating(0.7 * theta + 0.3, 0.8))  # ground truth: a cooler rater, the judge biased towards B
  cal = btd.calibrate(btd.counts(v[:200]), y[:200])
  assert cal.nu == pytest.approx(0.8, rel=0.05) and cal.slope == pytest.approx(0.7, abs=0.03)
  assert cal.offset == pytest.approx(0.3, abs=0.03)
  y = np.asarray(btd.rating(0.7 * theta + 0.3, 2.0))  # and one that also ties more often than the judge
  scores = {n: btd.self_aggregation(lambda its, smp: [btd.A if s.count(btd.A) > s.count(btd.B) else btd.B
                                                      for s in smp], range(200), [list(r[:n]) for r in v[200:]])
            for n in (4, 32)}
  rows = btd.evaluate(v[:200], y[:200], v[200:], y[200:], (4, 32), self_scores=scores)
  by = {(r["method"], r["n"]): r for r in rows}
  assert {m for m, _ in by} == {"majority", "soft_sc", "btd_raw", "btd", "self_aggregation"}
  for n in (4, 32):
    assert by["btd", n]["mae"] < min(by[m, n]["mae"] for m in ("majority", "soft_sc", "self_aggregation"))
  assert by["btd", 32]["mae"] < by["btd", 4]["mae"]
  assert by["btd", 32]["pairwise_accuracy"] >= by["majority", 32]["pairwise_accuracy"]


def test_boundary_errors():
  with pytest.raises(ValueError, match="axis of 3"):
    btd.fit(np.ones((4, 2)))
  with pytest.raises(ValueError, match="prior > 0"):
    btd.calibrate(np.ones((4, 3)), np.full(4, 0.5), prior=0.0)
  with pytest.raises(ValueError, match="one rating per item"):
    btd.calibrate(np.ones((4, 3)), np.full(3, 0.5))
