"""The contract every registered optimizer meets: converges on a quadratic, compiles once, runs FSDP-sharded."""
import jax
import jax.numpy as jnp
import optax
import pytest

from jaxlab import optim

STEPS = 200
# Peak learning rate and hyperparameters per optimizer for the quadratic (cosine decay to 0 over STEPS).
SETTINGS = {
    "adamw": (0.1, {}),
    "sgd": (0.3, {"adam_lr": 0.1}),
    "sgd_colnorm": (0.3, {"adam_lr": 0.1}),
    "colnorm_momentum": (0.3, {"adam_lr": 0.1}),
    "scale": (0.3, {"adam_lr": 0.1, "last_layer": lambda path: path.endswith("quad/v")}),
    "galore": (0.3, {"rank": 8, "update_proj_gap": 10, "scale": 1.0}),
    "apollo": (0.1, {"rank": 8, "update_proj_gap": 10}),
    "apollo_mini": (0.1, {"update_proj_gap": 10}),
    "muon": (0.3, {"adam_lr": optax.cosine_decay_schedule(0.1, STEPS)}),
}


def make(name, axes):
  lr, hp = SETTINGS[name]
  if "adam_lr" in hp and name != "muon":
    hp = dict(hp, peak_lr=lr)
  return optim.get(name, optax.cosine_decay_schedule(lr, STEPS), axes=axes, **hp)


@pytest.fixture
def problem(quad):
  params, target = quad(jax.random.key(0)), quad(jax.random.key(1))
  curv = jax.tree.map(lambda x: jax.random.uniform(jax.random.key(x.size), x.shape, minval=0.5, maxval=2.0), params)
  def loss(p):
    terms = jax.tree.map(lambda a, b, h: jnp.sum(0.5 * h * jnp.square(a - b)), p, target, curv)
    return sum(jax.tree.leaves(terms))
  return params, loss


def test_every_registered_optimizer_is_covered():
  assert set(SETTINGS) == set(optim.names())


def test_unknown_name_is_rejected():
  with pytest.raises(ValueError, match="unknown optimizer"):
    optim.get("adamw2", 1e-3)


def test_axis_rules_are_asked_for_where_needed(quad, quad_axes):
  with pytest.raises(TypeError, match="'scale' needs the params' logical axis rules"):
    optim.get("scale", 1e-3)
  optim.get("adamw", 1e-3).init(quad(jax.random.key(0)))  # adamw treats every leaf alike: no rules needed
  optim.get("adamw", 1e-3, axes=quad_axes).init(quad(jax.random.key(0)))


@pytest.mark.parametrize("name", list(SETTINGS))
def test_contract(name, problem, sharded_check, quad_axes):
  params, loss = problem
  tx = make(name, quad_axes)

  traces = []
  def update(g, s, p):
    traces.append(1)
    return tx.update(g, s, p)
  update = jax.jit(update)

  loss_and_grad = jax.jit(jax.value_and_grad(loss))
  p, state = params, tx.init(params)
  l0, g0 = loss_and_grad(p)
  for _ in range(STEPS):
    _, g = loss_and_grad(p)
    u, state = update(g, state, p)
    p = optax.apply_updates(p, u)
  assert len(traces) == 1, f"{name} retraced its update ({len(traces)} traces)"
  final = float(loss_and_grad(p)[0])
  assert final < float(l0) / 1e3, f"{name}: loss {float(l0)} -> {final}"

  sharded_check(tx, params, g0, steps=2, rtol=1e-4, atol=1e-5)
