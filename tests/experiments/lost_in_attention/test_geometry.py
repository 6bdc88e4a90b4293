"""Residual-update geometry on matrices with known answers, against a NumPy reference on a real forward, and
the interventions against the plain forward and a NumPy layer."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.lost_in_attention import geometry as geo
from jaxlab.models import transformer as tfm


def _orth(rng, n, r):
  return np.linalg.qr(rng.standard_normal((n, r)))[0]


def _low_rank(rng, s, h, sv):
  return _orth(rng, s, len(sv)) @ np.diag(sv) @ _orth(rng, h, len(sv)).T


def test_zero_update_gives_zero():
  x = np.random.default_rng(0).standard_normal((12, 8)).astype(np.float32)
  m = geo.update_metrics(jnp.asarray(x), jnp.zeros_like(x))
  for name in ("delta_s", "delta_d", "rid", "mixig"):
    assert abs(float(m[name])) < 1e-5, (name, m[name])


def test_erank_closed_forms():
  rng = np.random.default_rng(1)
  for r in (1, 3, 5):
    assert float(geo.erank(_low_rank(rng, 10, 7, [2.0] * r))) == pytest.approx(r, rel=1e-5)
  sv = np.array([3.0, 1.0, 0.5])
  p = sv / sv.sum()
  assert float(geo.erank(_low_rank(rng, 9, 6, sv))) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-5)
  assert float(geo.erank(np.zeros((4, 3)))) == 0.0
  # A known rank change: orthogonal directions added, equal singular values: eRank 2 -> 4.
  u, v = _orth(rng, 10, 4), _orth(rng, 6, 4)
  x, xn = u[:, :2] @ v[:, :2].T, u @ v.T
  assert float(geo.delta_s(x, xn)) == pytest.approx(2 / 6, rel=1e-5)


def test_delta_d_closed_forms():
  rng = np.random.default_rng(2)
  u, v = _orth(rng, 8, 5), _orth(rng, 6, 5)
  x = u[:, :3] @ np.diag([3.0, 2.0, 1.0]) @ v[:, :3].T
  inside = u[:, :3] @ rng.standard_normal((3, 3)) @ v[:, :3].T  # in both the column and row spaces of X
  assert float(geo.delta_d(x, x + inside)) < 1e-5
  e = lambda n, i: np.eye(n)[:, i:i + 1]
  x = e(5, 0) @ e(4, 0).T
  for a in (0.5, 2.0):
    both = x + a * e(5, 1) @ e(4, 1).T  # outside both spaces
    col = x + a * e(5, 1) @ e(4, 0).T  # outside the column space only
    assert float(geo.delta_d(x, both)) == pytest.approx(a / np.sqrt(1 + a * a), rel=1e-5)
    assert float(geo.delta_d(x, col)) == pytest.approx(a / (2 * np.sqrt(1 + a * a)), rel=1e-5)
  assert 0.0 <= float(geo.rid(x, both)) <= 2.0


def test_tme_closed_forms():
  rng = np.random.default_rng(3)
  for s in (2, 5, 9):
    same = np.tile(rng.standard_normal((1, 12)), (s, 1)) * rng.uniform(0.5, 2, (s, 1))
    assert float(geo.tme(same)) == pytest.approx(np.log(s), rel=1e-5)
    orth = _orth(rng, 12, s).T * rng.uniform(0.5, 2, (s, 1))
    p_self, p_other = 2 / (s + 1), 1 / (s + 1)
    want = -(p_self * np.log(p_self) + (s - 1) * p_other * np.log(p_other))
    assert float(geo.tme(orth)) == pytest.approx(want, rel=1e-5)
    assert float(geo.mixig(same, orth)) == pytest.approx(want - np.log(s), rel=1e-4, abs=1e-6)


def _np_metrics(x, y):
  """Independent NumPy float64 reference of every metric for X -> Y."""
  def svd(a):
    u, s, vt = np.linalg.svd(a, full_matrices=False)
    r = int((s > s[0] * max(a.shape) * np.finfo(np.float32).eps).sum())
    return u[:, :r], s[:r], vt[:r].T

  def erank(a):
    s = svd(a)[1]
    p = s / s.sum()
    return np.exp(-(p * np.log(p)).sum())

  def tme(a):
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    m = (a @ a.T + 1) / 2
    p = m / m.sum(-1, keepdims=True)
    return np.mean(-(p * np.log(np.where(p > 0, p, 1))).sum(-1))
  u, _, v = svd(x)
  dd = (np.linalg.norm(y - u @ u.T @ y) + np.linalg.norm(y - y @ v @ v.T)) / (2 * np.linalg.norm(y))
  ds = abs(erank(y) - erank(x)) / min(x.shape)
  return {"delta_s": ds, "delta_d": dd, "rid": ds + dd, "mixig": tme(y) - tme(x)}


@pytest.fixture(scope="module")
def lm():
  cfg = tfm.Config.tiny(vocab_size=50, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, n_layers=2)
  params = tfm.init(cfg, jax.random.key(0))
  params = jax.tree.map(lambda a: a * 10 if a.ndim == 3 else a, params)  # visible attention updates
  tok = jax.random.randint(jax.random.key(1), (2, 10), 0, 50)
  return cfg, params, tok


def test_module_metrics_match_numpy_on_forward(lm):
  cfg, params, tok = lm
  out = tfm.forward(params, tok, cfg, capture=("hidden_states", "attn_updates", "mlp_updates"))
  hs, a, m = (np.asarray(t, np.float64) for t in (out.hidden_states, out.attn_updates, out.mlp_updates))
  np.testing.assert_allclose(hs[1], hs[0] + a[0] + m[0], atol=1e-5)  # the residual bookkeeping assumed
  tokens = [1, 2, 4, 5, 6, 9]
  got = geo.metrics_from_output(out, tokens=tokens)
  for layer in range(cfg.n_layers):
    for b in range(tok.shape[0]):
      x = hs[layer, b, tokens]
      xa = x + a[layer, b, tokens]
      for module, (xi, yi) in {"attention": (x, xa), "ffn": (xa, xa + m[layer, b, tokens])}.items():
        for name, want in _np_metrics(xi, yi).items():
          assert float(got[module][name][layer, b]) == pytest.approx(want, rel=2e-3, abs=2e-5), (module, name)


def test_zero_noise_equals_plain_forward(lm):
  cfg, params, tok = lm
  plain = tfm.forward(params, tok, cfg).logits
  for iv in (geo.noise_update(jax.random.key(5), mix=0.0), geo.noise_update(jax.random.key(5), layers=[])):
    np.testing.assert_array_equal(tfm.forward(params, tok, cfg, intervention=iv).logits, plain)
  # std 0 with full replacement = a model whose attention output projection is zero.
  zero_o = jax.tree_util.tree_map_with_path(
      lambda p, a: jnp.zeros_like(a) if "/".join(str(getattr(k, "key", k)) for k in p).endswith("o/kernel") else a,
      params)
  np.testing.assert_allclose(tfm.forward(params, tok, cfg, intervention=geo.noise_update(
      jax.random.key(5), std=0.0)).logits, tfm.forward(zero_o, tok, cfg).logits, atol=1e-6)


def test_matched_norm_noise(lm):
  cfg, params, tok = lm
  cap = ("attn_updates",)
  plain = tfm.forward(params, tok, cfg, capture=cap).attn_updates
  noisy = tfm.forward(params, tok, cfg, capture=cap, intervention=geo.noise_update(jax.random.key(2), layers=[0]))
  u = noisy.attn_updates
  np.testing.assert_allclose(jnp.linalg.norm(u[0], axis=-1), jnp.linalg.norm(plain[0], axis=-1), rtol=1e-5)
  cos = jnp.sum(u[0] * plain[0], -1) / jnp.linalg.norm(u[0], axis=-1) / jnp.linalg.norm(plain[0], axis=-1)
  assert float(jnp.abs(cos).mean()) < 0.6  # a new, random direction
  std = tfm.forward(params, tok, cfg, capture=cap, intervention=geo.noise_update(jax.random.key(2), std=0.5))
  assert float(jnp.std(std.attn_updates)) == pytest.approx(0.5, rel=0.15)


def test_gaussian_qkv(lm):
  cfg, params, _ = lm
  new = geo.gaussian_qkv(params, jax.random.key(3), layers=[1], which=("q", "v"))
  old_a, new_a = params["layers"]["attn"], new["layers"]["attn"]
  np.testing.assert_array_equal(new_a["k"]["kernel"], old_a["k"]["kernel"])
  for name in ("q", "v"):
    np.testing.assert_array_equal(new_a[name]["kernel"][0], old_a[name]["kernel"][0])
    assert not np.allclose(new_a[name]["kernel"][1], old_a[name]["kernel"][1])
    assert float(jnp.std(new_a[name]["kernel"][1])) == pytest.approx(float(jnp.std(old_a[name]["kernel"][1])),
                                                                      rel=0.25)
  fixed = geo.gaussian_qkv(params, jax.random.key(3), layers=[0, 1], std=0.01)
  assert float(jnp.std(fixed["layers"]["attn"]["q"]["kernel"])) == pytest.approx(0.01, rel=0.15)
  with pytest.raises(ValueError, match="layers must lie"):
    geo.gaussian_qkv(params, jax.random.key(3), layers=[2])


def _np_layer_uniform(params, tok, cfg):
  """Layer 0 with uniform causal attention in NumPy: the attention update and the residual after the block."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  lp = jax.tree.map(lambda a: a[0], p["layers"])
  rms = lambda x, s: s * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.norm_eps)
  x = p["embed"]["embedding"][np.asarray(tok)]
  h = rms(x, lp["attn_norm"]["scale"])
  b, t, _ = x.shape
  v = (h @ lp["attn"]["v"]["kernel"]).reshape(b, t, cfg.kv_heads, cfg.kdim)
  v = np.repeat(v, cfg.n_heads // cfg.kv_heads, axis=2)  # query head i reads kv head i // (H / G)
  mean = np.cumsum(v, axis=1) / np.arange(1, t + 1)[None, :, None, None]
  a = mean.reshape(b, t, -1) @ lp["attn"]["o"]["kernel"]
  x1 = x + a
  hm = rms(x1, lp["mlp_norm"]["scale"])
  g = hm @ lp["mlp"]["gate"]["kernel"]
  mlp = (g / (1 + np.exp(-g)) * (hm @ lp["mlp"]["up"]["kernel"])) @ lp["mlp"]["down"]["kernel"]
  return a, x1 + mlp


def test_uniform_attention_matches_numpy(lm):
  cfg, params, tok = lm
  want_a, want_x = _np_layer_uniform(params, tok, cfg)
  t = tok.shape[1]
  for iv in (geo.fixed_attention("uniform_causal", layers=[0]), geo.fixed_attention("uniform", layers=[0]),
             geo.fixed_attention(geo.causal_uniform(t), layers=[0])):
    out = tfm.forward(params, tok, cfg, intervention=iv,
                      capture=("hidden_states", "attn_updates", "attn_weights"))
    np.testing.assert_allclose(out.attn_updates[0], want_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.hidden_states[1], want_x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.attn_weights[0], np.broadcast_to(geo.causal_uniform(t), out.attn_weights[0].shape))
    assert not np.allclose(out.attn_weights[1], out.attn_weights[0])  # layer 1 untouched
  with pytest.raises(ValueError, match="pattern must end"):
    tfm.forward(params, tok, cfg, intervention=geo.fixed_attention(np.ones((3, 3))))
