"""jaxlab.models.heads: value and step heads against a NumPy forward, padding-aware reads, PRM aggregation
against brute-force loops over steps, logical axes, and sharded == single device."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab import sharding
from jaxlab.models import heads, transformer as tfm
from jaxlab.nn import axes

D = 16


def _np_head(params, kind, h):
  if kind == "value":
    p = params["v_head"]["summary"]
    return 1 / (1 + np.exp(-(h @ np.asarray(p["kernel"]) + np.asarray(p["bias"]))[..., 0]))
  p = params["score"]
  z = np.maximum(h @ np.asarray(p["dense"]["kernel"]) + np.asarray(p["dense"]["bias"]), 0)
  z = z @ np.asarray(p["out"]["kernel"]) + np.asarray(p["out"]["bias"])
  e = np.exp(z - z.max(-1, keepdims=True))
  return (e / e.sum(-1, keepdims=True))[..., 1]


def _params(kind, seed=0):
  cfg = heads.Config(kind=kind, d_model=D, init_std=0.5)
  params = heads.init(cfg, jax.random.PRNGKey(seed))
  # non-zero biases so the test sees them
  return cfg, jax.tree.map(lambda x: x + 0.1 * jnp.arange(x.size, dtype=x.dtype).reshape(x.shape) / x.size, params)


@pytest.mark.parametrize("kind", heads.KINDS)
def test_position_rewards_match_numpy(kind):
  cfg, params = _params(kind)
  h = np.random.default_rng(0).normal(size=(3, 7, D)).astype(np.float32)
  got = heads.position_rewards(params, cfg, jnp.asarray(h))
  np.testing.assert_allclose(np.asarray(got), _np_head(params, kind, h), rtol=1e-5, atol=1e-6)


def test_last_token_reward_reads_the_last_real_token_on_either_padding_side():
  cfg, params = _params("value")
  h = np.random.default_rng(1).normal(size=(3, 6, D)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
  want = _np_head(params, "value", h)[np.arange(3), [3, 5, 0]]
  np.testing.assert_allclose(np.asarray(heads.last_token_reward(params, cfg, jnp.asarray(h), jnp.asarray(mask))),
                             want, rtol=1e-6)


@pytest.mark.parametrize("rule", heads.AGGREGATIONS)
def test_aggregation_over_separator_positions_matches_loops(rule):
  rng = np.random.default_rng(2)
  sep = 9
  tokens = rng.integers(0, 8, size=(5, 12))
  tokens[rng.random(tokens.shape) < 0.25] = sep
  tokens[4] = 1  # a solution without steps
  mask = np.ones_like(tokens)
  mask[0, 9:] = 0
  r = rng.random(tokens.shape).astype(np.float32)
  steps = heads.separator_mask(jnp.asarray(tokens), sep, jnp.asarray(mask))
  assert np.array_equal(np.asarray(steps), ((tokens == sep) & (mask > 0)).astype(np.int32))
  got = np.asarray(heads.aggregate(jnp.asarray(r), steps, rule))
  for b in range(5):
    vals = [r[b, t] for t in range(12) if tokens[b, t] == sep and mask[b, t]]
    want = {"min": min(vals, default=1.0), "last": vals[-1] if vals else 0.0,
            "product": float(np.prod(vals)) if vals else 1.0}[rule]
    np.testing.assert_allclose(got[b], want, rtol=1e-5)
  with pytest.raises(ValueError, match="aggregation must be one of"):
    heads.aggregate(jnp.asarray(r), steps, "mean")


def test_every_param_has_logical_axes_and_bad_config_is_named():
  for kind in heads.KINDS:
    cfg, params = _params(kind)
    names = axes.logical_axes(params, heads.AXES)
    for leaf, n in zip(jax.tree.leaves(params), jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, tuple))):
      assert len(n) == leaf.ndim and None not in n
  with pytest.raises(ValueError, match="kind must be one of"):
    heads.Config(kind="pairwise")


@pytest.mark.parametrize("spec,rules", [("data:2,tensor:4", "tp"), ("fsdp:8", "fsdp")])
def test_step_head_on_lm_states_sharded_equals_single_device(spec, rules):
  lm_cfg = tfm.Config.tiny()
  lm = tfm.init(lm_cfg, jax.random.PRNGKey(0))
  cfg = heads.Config(kind="step", d_model=lm_cfg.d_model)
  params = {"lm": lm, "head": heads.init(cfg, jax.random.PRNGKey(1))}
  tokens = np.random.default_rng(3).integers(0, lm_cfg.vocab_size, size=(8, 10)).astype(np.int32)
  fn = jax.jit(lambda p, t: heads.aggregate(
      heads.position_rewards(p["head"], cfg, heads.hidden_states(p["lm"], lm_cfg, t)),
      heads.separator_mask(t, 5), "min"))
  single = fn(params, jnp.asarray(tokens))
  mesh = sharding.make_mesh(spec)
  multi = fn(sharding.shard_params(params, mesh, rules, axes=tfm.AXES + heads.AXES),
             sharding.shard_batch({"t": tokens}, mesh)["t"])
  np.testing.assert_allclose(np.asarray(multi), np.asarray(single), atol=2e-6)


@pytest.mark.parametrize("kind", heads.KINDS)
def test_prm_step_loss_matches_numpy(kind):
  from jaxlab import losses
  rng = np.random.default_rng(5)
  z = rng.normal(size=(3, 6, 1 if kind == "value" else 2)).astype(np.float32)
  labels = rng.integers(0, 2, size=(3, 6))
  steps = rng.integers(0, 2, size=(3, 6))
  if kind == "value":
    p = 1 / (1 + np.exp(-z[..., 0]))
    per = -(labels * np.log(p) + (1 - labels) * np.log(1 - p))
  else:
    lse = np.log(np.exp(z).sum(-1))
    per = lse - np.take_along_axis(z, labels[..., None], -1)[..., 0]
  s, w = losses.prm_step_loss(jnp.asarray(z), jnp.asarray(labels), jnp.asarray(steps))
  np.testing.assert_allclose(float(s), (per * steps).sum(), rtol=1e-5)
  assert float(w) == steps.sum()


def test_head_only_prm_learns_separable_step_labels():
  """A step (three tokens) is right when it is written in token 7 and wrong in token 8; the separator (5) follows
  each step. A step head on a frozen random LM reaches near-perfect step accuracy; the LM params do not move."""
  import optax
  from jaxlab import losses
  lm_cfg = tfm.Config.tiny()
  rng = np.random.default_rng(6)

  def batch(n):
    toks, labels = rng.integers(10, 40, size=(n, 12)), np.zeros((n, 12), np.int32)
    for t in (3, 7, 11):
      right = rng.random(n) < 0.5
      toks[:, t - 3:t] = np.where(right, 7, 8)[:, None]
      toks[:, t] = 5
      labels[:, t] = right
    return {"tokens": jnp.asarray(toks, jnp.int32), "labels": jnp.asarray(labels),
            "steps": heads.separator_mask(jnp.asarray(toks), 5)}

  cfg = heads.Config(kind="step", d_model=lm_cfg.d_model)
  params = {"lm": tfm.init(lm_cfg, jax.random.PRNGKey(0)), "head": heads.init(cfg, jax.random.PRNGKey(1))}
  loss_fn = losses.prm_loss_fn(lm_cfg, cfg)
  tx = optax.adam(3e-2)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt, b):
    g = jax.grad(lambda p: (lambda s, w, _: s / w)(*loss_fn(p, b, None)))(params)
    upd, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, upd), opt, g

  lm0 = params["lm"]
  for _ in range(150):
    params, opt, g = step(params, opt, batch(32))
  assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(g["lm"]))
  assert all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(lm0), jax.tree.leaves(params["lm"])))
  test = batch(256)
  r = heads.position_rewards(params["head"], cfg, heads.hidden_states(params["lm"], lm_cfg, test["tokens"]))
  m = np.asarray(test["steps"]) > 0
  acc = np.mean((np.asarray(r)[m] > 0.5) == (np.asarray(test["labels"])[m] > 0))
  assert acc > 0.97, acc
  mins = heads.aggregate(r, test["steps"], "min")
  all_right = np.asarray(test["labels"]).sum(1) == 3
  assert np.mean((np.asarray(mins) > 0.5) == all_right) > 0.9
