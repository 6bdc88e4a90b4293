"""GaLore (arXiv 2403.03507) and APOLLO (arXiv 2412.05270) against NumPy re-derivations of their reference steps.

The oracles follow the PyTorch reference optimizers (GaLoreAdamW / APOLLO AdamW) step by step in the [out, in]
orientation: stacked quad/w [2, 16, 24] (fan-in 16, out 24 >= in: "right" projection per layer), quad/v [24, 16]
(fan-in 24, out 16 < in: "left"), quad/b a vector with plain AdamW. Three steps with T=2 cover a refresh.
"""
import jax
import numpy as np
import optax
import pytest

from jaxlab import optim
from jaxlab.optim.apollo import random_projection

SCHED = optax.linear_schedule(2e-2, 1e-2, 3)
WD, RANK, GAP, B1, B2, EPS = 0.1, 4, 2, 0.9, 0.999, 1e-6


def as_out_in(params):
  """The reference's weight matrices: w per layer transposed to [out, in], v transposed, b as is."""
  q = {k: np.asarray(x, np.float64) for k, x in params["quad"].items()}
  return {"w": [q["w"][i].T for i in range(2)], "v": [q["v"].T], "b": [q["b"]]}


def fix_signs(vecs, axis):
  idx = np.argmax(np.abs(vecs), axis=axis)
  return vecs * np.sign(np.take_along_axis(vecs, np.expand_dims(idx, axis), axis))


def adam_state():
  return {"m": 0.0, "v": 0.0}


def adam_norm(st, g):
  st["m"] = B1 * st["m"] + (1 - B1) * g
  st["v"] = B2 * st["v"] + (1 - B2) * g * g
  return st["m"] / (np.sqrt(st["v"]) + EPS)


def reference_loop(params, grads_seq, low_rank_step):
  """Shared outer loop: step_size = lr sqrt(1-b2^t)/(1-b1^t); p -= step_size * d; p -= lr wd p."""
  p = as_out_in(params)
  states = {k: [dict(adam_state(), proj=None, prev=None) for _ in p[k]] for k in p}
  for it, grads in enumerate(grads_seq):
    g_all, lr, t = as_out_in(grads), float(SCHED(it)), it + 1
    step_size = lr * np.sqrt(1 - B2 ** t) / (1 - B1 ** t)
    for k in p:
      for i, g in enumerate(g_all[k]):
        st = states[k][i]
        d = adam_norm(st, g) if k == "b" else low_rank_step(st, g, it, k, i)
        p[k][i] = p[k][i] - step_size * d
        p[k][i] = p[k][i] - lr * WD * p[k][i]
  return {"w": np.stack([x.T for x in p["w"]]), "v": p["v"][0].T, "b": p["b"][0]}


def galore_step(scale, side=None):
  def step(st, g, it, k, i):
    right = g.shape[0] >= g.shape[1] if side is None else side == "right"
    if it % GAP == 0:
      u, _, vh = np.linalg.svd(g, full_matrices=False)
      st["proj"] = fix_signs(vh[:RANK], 1) if right else fix_signs(u[:, :RANK], 0)
    q = st["proj"]
    n = adam_norm(st, g @ q.T if right else q.T @ g)
    return scale * (n @ q if right else q @ n)
  return step


def apollo_step(scale, scale_type):
  leaf_index = {"v": 0, "w": 1}  # projected leaves in tree order (b is not projected)
  def step(st, g, it, k, i):
    right = g.shape[0] >= g.shape[1]
    proj = np.asarray(random_projection(0, leaf_index[k], it // GAP,
                                        (2, RANK, 16) if k == "w" else (16, RANK), RANK), np.float64)
    proj = proj[i] if k == "w" else proj
    r = g @ proj.T if right else proj.T @ g
    n = adam_norm(st, r)
    if scale_type == "tensor":
      factor = np.linalg.norm(n) / (np.linalg.norm(r) + 1e-8)
    else:
      axis = 1 if right else 0
      factor = np.expand_dims(np.linalg.norm(n, axis=axis) / (np.linalg.norm(r, axis=axis) + 1e-8), axis)
    scaled = g * factor
    norm = np.linalg.norm(scaled)
    if st["prev"] is not None:
      limiter = max(norm / (st["prev"] + 1e-8), 1.01) / 1.01
      scaled, norm = scaled / limiter, norm / limiter
    st["prev"] = norm
    return scaled * np.sqrt(scale)
  return step


def run(tx, params, grads_seq):
  state, update = tx.init(params), jax.jit(tx.update)
  for g in grads_seq:
    u, state = update(g, state, params)
    params = optax.apply_updates(params, u)
  return params


@pytest.fixture
def problem(quad):
  params = quad(jax.random.key(0))
  grads_seq = [quad(jax.random.key(10 + i)) for i in range(3)]
  return params, grads_seq


def check(got, want):
  for k in want:
    np.testing.assert_allclose(np.asarray(got["quad"][k]), want[k], rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("proj_type", ["std", "right", "left"])
def test_galore_equals_reference_steps(problem, proj_type, quad_axes):
  params, grads_seq = problem
  tx = optim.galore(SCHED, axes=quad_axes, rank=RANK, update_proj_gap=GAP, scale=0.25, weight_decay=WD,
                    proj_type=proj_type)
  want = reference_loop(params, grads_seq, galore_step(0.25, None if proj_type == "std" else proj_type))
  check(run(tx, params, grads_seq), want)


@pytest.mark.parametrize("scale_type,scale", [("channel", 1.0), ("tensor", 128.0)])
def test_apollo_equals_reference_steps(problem, scale_type, scale, quad_axes):
  params, grads_seq = problem
  grads_seq = [grads_seq[0], *(optax.tree.scale(3.0, g) for g in grads_seq[1:])]  # growing norms: limiter acts
  tx = optim.apollo(SCHED, axes=quad_axes, rank=RANK, update_proj_gap=GAP, scale=scale, scale_type=scale_type,
                    weight_decay=WD)
  check(run(tx, params, grads_seq), reference_loop(params, grads_seq, apollo_step(scale, scale_type)))


def test_apollo_projection_statistics_and_refresh():
  a = np.asarray(random_projection(0, 0, 0, (256, 512), 16))
  b = np.asarray(random_projection(0, 0, 1, (256, 512), 16))
  assert abs(a.mean()) < 5e-3 and abs(a.var() * 16 - 1) < 2e-2
  assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 1e-2


def test_galore_state_is_low_rank(quad, quad_axes):
  state = optim.galore(1e-2, axes=quad_axes, rank=RANK).init(quad(jax.random.key(0)))
  low = state[0].inner_states["low_rank"].inner_state
  shapes = {k: (low.proj["quad"][k].shape, low.mu["quad"][k].shape) for k in ("w", "v")}
  assert shapes == {"w": ((2, RANK, 16), (2, 24, RANK)), "v": ((16, RANK), (RANK, 24))}
