"""Meshes, rule tables, param/batch placement, sharded == single-device, and a 2-process CPU run."""
import dataclasses
import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import portpicker
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import sharding
from jaxlab.nn import axes

try:
  from jaxlab.models import transformer as tfm
except ImportError:
  tfm = None

# Logical names of the decoder-LM params (the layout every strategy must place).
NAMES = {
    "embed/embedding": ("vocab", "embed"),
    "layers/attn_norm/scale": ("layers", "embed"),
    "layers/attn/q/kernel": ("layers", "embed", "q_heads"),
    "layers/attn/k/kernel": ("layers", "embed", "kv_heads"),
    "layers/attn/v/kernel": ("layers", "embed", "kv_heads"),
    "layers/attn/o/kernel": ("layers", "q_heads", "embed"),
    "layers/mlp_norm/scale": ("layers", "embed"),
    "layers/mlp/gate/kernel": ("layers", "embed", "mlp"),
    "layers/mlp/up/kernel": ("layers", "embed", "mlp"),
    "layers/mlp/down/kernel": ("layers", "mlp", "embed"),
    "final_norm/scale": ("embed",),
    "lm_head/kernel": ("embed", "vocab"),
}
# What each strategy is meant to do with each logical name (None: replicated).
INTENT = {
    "dp": {},
    "fsdp": {"embed": "fsdp"},
    "tp": {"vocab": "tensor", "q_heads": "tensor", "kv_heads": "tensor", "mlp": "tensor"},
    "fsdp_tp": {"embed": "fsdp", "vocab": "tensor", "q_heads": "tensor", "kv_heads": "tensor", "mlp": "tensor"},
}

# The decoder's axis rules; without the model module, rules for exactly the layout above.
AXES = tfm.AXES if tfm is not None else axes.rules(
    *((path.removeprefix("layers/"), names[1:] if names[0] == "layers" else names) for path, names in NAMES.items()))

V, D, H, G, K, F, L = 64, 32, 4, 2, 8, 64, 2


def fake_params(seed, v=V, g=G):
  rng = np.random.default_rng(seed)
  def w(*shape):
    return (rng.standard_normal(shape) / np.sqrt(shape[-2] if len(shape) > 1 else 1)).astype(np.float32)
  return {
      "embed": {"embedding": w(v, D)},
      "layers": {
          "attn_norm": {"scale": 1 + 0.1 * w(L, D)},
          "attn": {"q": {"kernel": w(L, D, H * K)}, "k": {"kernel": w(L, D, g * K)},
                   "v": {"kernel": w(L, D, g * K)}, "o": {"kernel": w(L, H * K, D)}},
          "mlp_norm": {"scale": 1 + 0.1 * w(L, D)},
          "mlp": {"gate": {"kernel": w(L, D, F)}, "up": {"kernel": w(L, D, F)}, "down": {"kernel": w(L, F, D)}},
      },
      "final_norm": {"scale": 1 + 0.1 * w(D)},
      "lm_head": {"kernel": w(D, v)},
  }


def fake_shapes(**kw):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), fake_params(0, **kw))


def leaves_by_path(tree, is_leaf=None):
  return {axes.path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree, is_leaf=is_leaf)}


# ---------------------------------------------------------------------------------------------- mesh

@pytest.mark.parametrize("spec, shape", [
    ("data:2,fsdp:2,tensor:2", (2, 2, 2)), ("fsdp:4,tensor:2", (1, 4, 2)), ("tensor:2, data:-1", (4, 1, 2)),
    ("fsdp", (1, 8, 1)), (None, (8, 1, 1)), ("data:8", (8, 1, 1))])
def test_make_mesh_parses(spec, shape):
  mesh = sharding.make_mesh(spec)
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  assert tuple(mesh.shape.values()) == shape
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())


@pytest.mark.parametrize("spec, match", [
    ("data:3", "asks for 3 devices"), ("data:2,fsdp:2", "asks for 4"), ("model:8", "unknown axis 'model'"),
    ("data:2,data:4", "given twice"), ("data:-1,fsdp:-1", "only one axis"), ("data:3,fsdp:-1", "not divisible"),
    ("data:two", "must be an integer"), ("data:0,fsdp:-1", ">= 1")])
def test_make_mesh_errors(spec, match):
  with pytest.raises(ValueError, match=match):
    sharding.make_mesh(spec)


def test_make_mesh_on_a_device_subset():
  mesh = sharding.make_mesh("fsdp:2,tensor:2", devices=jax.devices()[:4])
  assert mesh.devices.size == 4 and tuple(mesh.shape.values()) == (1, 2, 2)


# --------------------------------------------------------------------------------------------- rules

def test_rule_tables_cover_the_same_names():
  names = {s: {n for n, _ in r} for s, r in sharding.RULES.items()}
  assert all(v == names["dp"] for v in names.values())
  assert set().union(*NAMES.values()) | {"batch", "seq"} <= names["dp"]


@pytest.mark.parametrize("module", ["encoder", "pointcloud", "program_predictor", "qformer", "transformer", "video",
                                    "vit", "whisper"])
def test_rule_tables_name_every_axis_a_model_declares(module):
  """Every logical name in a model's `param_axes` has a rule, so `shard_params` accepts the model as is."""
  import importlib
  mod = importlib.import_module(f"jaxlab.models.{module}")
  cfg = next(iter(mod.PRESETS.values())) if hasattr(mod, "PRESETS") else mod.Config()
  declared = {n for names in jax.tree.leaves(mod.param_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))
              for n in names if n is not None}
  assert declared and declared <= {n for n, _ in sharding.RULES["dp"]}, sorted(declared)


@pytest.mark.parametrize("strategy", sorted(INTENT))
def test_param_specs_follow_the_strategy(strategy):
  shapes = (jax.eval_shape(functools.partial(tfm.init, tfm.Config.tiny()), jax.random.key(0)) if tfm is not None
            else fake_shapes())
  specs = leaves_by_path(sharding.param_specs(shapes, strategy, axes=AXES), is_leaf=lambda x: isinstance(x, P))
  checked = 0
  for path, names in NAMES.items():
    if path in specs:
      assert specs[path] == P(*(INTENT[strategy].get(n) for n in names)), path
      checked += 1
  assert checked >= 10


def test_indivisible_dims_fall_back_to_replication():
  shapes = fake_shapes(v=50, g=1)  # vocab 50, kv dim 8
  mesh = sharding.make_mesh("fsdp:2,tensor:4")
  specs = leaves_by_path(sharding.param_specs(shapes, "fsdp_tp", mesh, axes=AXES), is_leaf=lambda x: isinstance(x, P))
  assert specs["embed/embedding"] == P(None, "fsdp")            # 50 % 4 != 0
  assert specs["lm_head/kernel"] == P("fsdp", None)
  assert specs["layers/attn/k/kernel"] == P(None, "fsdp", "tensor")  # 8 % 4 == 0
  assert specs["layers/attn/q/kernel"] == P(None, "fsdp", "tensor")
  mesh8 = sharding.make_mesh("tensor:8")
  specs8 = leaves_by_path(sharding.param_specs(shapes, "tp", mesh8, axes=AXES), is_leaf=lambda x: isinstance(x, P))
  assert specs8["layers/attn/k/kernel"] == P(None, None, "tensor")
  assert specs8["layers/mlp/up/kernel"] == P(None, None, "tensor")
  # a tuple target keeps its longest dividing prefix: batch 6 over data=2 x fsdp=4 -> data only
  mesh24 = sharding.make_mesh("data:2,fsdp:4")
  assert sharding.logical_to_spec(("batch", "seq"), "dp", shape=(6, 3), mesh=mesh24) == P("data", None)
  assert sharding.logical_to_spec(("batch", "seq"), "dp", shape=(8, 3), mesh=mesh24) == P(("data", "fsdp"), None)


def test_conflicting_rules_fail_loudly():
  with pytest.raises(ValueError, match="conflicting sharding rules for logical axis 'embed'"):
    sharding.logical_to_spec(("embed",), (("embed", "fsdp"), ("embed", "tensor")))
  sharding.logical_to_spec(("embed",), (("embed", "fsdp"), ("embed", "fsdp")))  # a repeat is no conflict
  rules = tuple((n, "fsdp" if n in ("embed", "mlp") else t) for n, t in sharding.RULES["dp"])
  clash = r"layers/mlp/(up|gate|down)/kernel.*dims \['(embed|mlp)', '(embed|mlp)'\].*'fsdp'"
  with pytest.raises(ValueError, match=clash):
    sharding.param_specs(fake_shapes(), rules, axes=AXES)
  with pytest.raises(ValueError, match="mesh has axes"):
    sharding.logical_to_spec(("embed",), (("embed", "model"),))


def test_unknown_logical_name_fails_naming_it_and_the_param():
  rules = tuple(r for r in sharding.RULES["fsdp_tp"] if r[0] != "mlp")
  with pytest.raises(KeyError, match=r"'mlp'.*layers/mlp/(gate|up|down)/kernel"):
    sharding.param_specs(fake_shapes(), rules, axes=AXES)
  with pytest.raises(KeyError, match="no logical axes for parameter 'mystery/w'"):
    sharding.param_specs({"mystery": {"w": jnp.zeros((2, 2))}}, "dp", axes=AXES)
  with pytest.raises(TypeError, match="param_specs needs the params' logical axis rules"):
    sharding.param_specs(fake_shapes(), "dp", axes=None)


# ------------------------------------------------------------------------- sharded == single device

def rms(x):
  return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


def loss_fn(p, tokens_BT):
  B, T = tokens_BT.shape
  h_BTD = p["embed"]["embedding"][tokens_BT]
  mask_TT = jnp.tril(jnp.ones((T, T), bool))

  def layer(h_BTD, lp):
    a = rms(h_BTD) * lp["attn_norm"]["scale"]
    q_BTHK = (a @ lp["attn"]["q"]["kernel"]).reshape(B, T, H, K)
    k_BTHK = jnp.repeat((a @ lp["attn"]["k"]["kernel"]).reshape(B, T, G, K), H // G, axis=2)
    v_BTHK = jnp.repeat((a @ lp["attn"]["v"]["kernel"]).reshape(B, T, G, K), H // G, axis=2)
    s_BHTS = jnp.where(mask_TT, jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BTHK) / np.sqrt(K), -1e9)
    o_BTHK = jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(s_BHTS, -1), v_BTHK)
    h_BTD = h_BTD + o_BTHK.reshape(B, T, H * K) @ lp["attn"]["o"]["kernel"]
    m = rms(h_BTD) * lp["mlp_norm"]["scale"]
    h_BTD = h_BTD + (jax.nn.silu(m @ lp["mlp"]["gate"]["kernel"]) * (m @ lp["mlp"]["up"]["kernel"])) @ \
        lp["mlp"]["down"]["kernel"]
    return h_BTD, None

  h_BTD, _ = jax.lax.scan(layer, h_BTD, p["layers"])
  logits_BTV = (rms(h_BTD) * p["final_norm"]["scale"]) @ p["lm_head"]["kernel"]
  logp = jax.nn.log_softmax(logits_BTV[:, :-1], -1)
  return -jnp.mean(jnp.take_along_axis(logp, tokens_BT[:, 1:, None], -1))


@pytest.fixture(scope="module")
def single_device_reference():
  params = fake_params(1)
  tokens = np.asarray(jax.random.randint(jax.random.key(2), (8, 12), 0, V))
  cpu0 = jax.devices()[0]
  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(jax.device_put(params, cpu0), jax.device_put(tokens, cpu0))
  return params, tokens, loss, grads


@pytest.mark.parametrize("spec, strategy", [("data:8", "dp"), ("fsdp:4,tensor:2", "fsdp_tp"),
                                            ("data:2,fsdp:2,tensor:2", "fsdp_tp")])
def test_sharded_loss_and_grads_match_single_device(spec, strategy, single_device_reference):
  params, tokens, ref_loss, ref_grads = single_device_reference
  mesh = sharding.make_mesh(spec)
  p_sh = sharding.param_shardings(params, mesh, strategy, axes=AXES)
  sharded = sharding.shard_params(params, mesh, strategy, axes=AXES)
  batch = sharding.shard_batch(tokens, mesh)
  step = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(p_sh, sharding.batch_sharding(mesh)),
                 out_shardings=(NamedSharding(mesh, P()), p_sh))
  loss, grads = step(sharded, batch)

  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, ref_grads)
  up = grads["layers"]["mlp"]["up"]["kernel"]
  n_param_shards = mesh.shape["fsdp"] * mesh.shape["tensor"]
  assert up.addressable_shards[0].data.size * n_param_shards == up.size
  assert batch.addressable_shards[0].data.shape[0] * mesh.shape["data"] * mesh.shape["fsdp"] == 8


@dataclasses.dataclass(frozen=True)
class _Cfg:
  vocab: int = V


def test_sharded_init_matches_plain_init_and_lands_sharded():
  mesh = sharding.make_mesh("fsdp:4,tensor:2")
  def init(cfg, key):  # a config argument stays a Python constant
    return jax.tree.map(lambda x: x * jax.random.uniform(key), fake_params(0, v=cfg.vocab))
  params = sharding.sharded_init(init, mesh, "fsdp_tp", _Cfg(), jax.random.key(3), axes=AXES)
  expected = sharding.param_shardings(fake_shapes(), mesh, "fsdp_tp", axes=AXES)
  jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim) or pytest.fail(f"{x.sharding} != {s}"),
               params, expected)
  scale = jax.random.uniform(jax.random.key(3))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b * scale, rtol=1e-6), params, fake_params(0))
  shapes = sharding.sharded_shapes(init, mesh, "fsdp_tp", _Cfg(), jax.random.key(3), axes=AXES)
  assert shapes["lm_head"]["kernel"].sharding.spec == P("fsdp", "tensor")


def test_shard_batch_values_and_errors():
  mesh = sharding.make_mesh("data:2,fsdp:2,tensor:2")
  batch = {"tokens": np.arange(24).reshape(8, 3), "n": np.int32(5)}
  out = sharding.shard_batch(batch, mesh)
  np.testing.assert_array_equal(out["tokens"], batch["tokens"])
  assert out["tokens"].sharding.spec == P(("data", "fsdp")) and int(out["n"]) == 5
  with pytest.raises(ValueError, match="global batch 6 is not divisible by data\\*fsdp = 4"):
    sharding.shard_batch(np.zeros((6, 3)), mesh)


# ------------------------------------------------------------------------------------ multi-process

def test_rows_split_over_the_batch_axes_when_they_divide_else_replicate():
  mesh = sharding.make_mesh("data:2,fsdp:2,tensor:2")
  x, odd = np.arange(8 * 3).reshape(8, 3), np.arange(6 * 3).reshape(6, 3)
  placed = sharding.shard_rows({"x": x, "odd": odd, "scalar": np.int32(5)}, mesh)
  assert placed["x"].sharding.spec == P(("data", "fsdp")) and placed["odd"].sharding.spec == P()
  assert {tuple(s.data.shape) for s in placed["x"].addressable_shards} == {(2, 3)}
  np.testing.assert_array_equal(np.asarray(placed["x"]), x)
  np.testing.assert_array_equal(np.asarray(placed["odd"]), odd)
  abstract = sharding.abstract_rows({"x": ((8, 3), np.int64), "odd": ((6, 3), np.int64)}, mesh)
  assert all(abstract[k].sharding == placed[k].sharding for k in ("x", "odd"))
  assert sharding.shard_rows({"x": x}, None)["x"] is x


def test_first_slurm_host():
  assert sharding._first_slurm_host("node001") == "node001"
  assert sharding._first_slurm_host("node001,host2") == "node001"
  assert sharding._first_slurm_host("gpu[003-004,9],cpu1") == "gpu003"
  assert sharding._first_slurm_host("rack[2,5]-n[07-09]") == "rack2-n07"


@pytest.fixture
def clean_env(monkeypatch):
  for k in list(os.environ):
    if k.startswith(("JAXLAB_", "SLURM_", "TPU_", "CLOUD_TPU", "MEGASCALE")):
      monkeypatch.delenv(k)
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: calls.append((a, kw)))
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  return monkeypatch, calls


def test_initialize_distributed_sources(clean_env):
  env, calls = clean_env
  assert sharding.initialize_distributed() == (0, 1) and not calls
  env.setenv("SLURM_NTASKS", "4")
  env.setenv("SLURM_PROCID", "1")
  env.setenv("SLURM_STEP_NODELIST", "n[3-4]")
  env.setenv("SLURM_JOB_ID", "7")
  assert sharding.initialize_distributed() == (1, 4)
  assert calls[-1][0] == ("n3:61447", 4, 1)
  env.setenv("JAXLAB_COORDINATOR", "10.0.0.1:1234")
  sharding.initialize_distributed()
  assert calls[-1][0] == ("10.0.0.1:1234", 4, 1)
  env.setenv("JAXLAB_NUM_PROCESSES", "2")
  env.delenv("JAXLAB_COORDINATOR")
  with pytest.raises(ValueError, match="need a coordinator address"):
    sharding.initialize_distributed()
  for k in ("SLURM_NTASKS", "SLURM_PROCID", "JAXLAB_NUM_PROCESSES"):
    env.delenv(k)
  env.setenv("TPU_WORKER_HOSTNAMES", "t0,t1")
  env.setattr(jax, "process_index", lambda: 0)
  env.setattr(jax, "process_count", lambda: 2)
  assert sharding.initialize_distributed() == (0, 2) and calls[-1][0] == ()


def test_two_cpu_processes_psum_and_allgather(tmp_path):
  port = portpicker.pick_unused_port()
  worker = os.path.join(os.path.dirname(__file__), "dist_worker.py")
  procs, logs = [], []
  for i in range(2):
    env = dict(os.environ, JAXLAB_COORDINATOR=f"127.0.0.1:{port}", JAXLAB_NUM_PROCESSES="2",
               JAXLAB_PROCESS_ID=str(i), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out, err = open(tmp_path / f"{i}.out", "w+"), open(tmp_path / f"{i}.err", "w+")  # files: no pipe stalls
    logs.append((out, err))
    procs.append(subprocess.Popen([sys.executable, worker], env=env, stdout=out, stderr=err, text=True))
  results = []
  try:
    for p, (out, err) in zip(procs, logs):
      p.wait(timeout=180)
      err.seek(0)
      out.seek(0)
      assert p.returncode == 0, err.read()[-3000:]
      results.append(json.loads(out.read().strip().splitlines()[-1]))
  finally:
    for p, files in zip(procs, logs):
      if p.poll() is None:
        p.kill()
      for f in files:
        f.close()
  rows = np.concatenate([np.arange(6.0).reshape(2, 3) + 100 * i for i in range(2)])  # the global batch
  for i, r in enumerate(results):
    assert r["process"] == [i, 2] and r["again"] == [i, 2] and r["devices"] == 4
    assert r["gathered_ids"] == [0, 1]
    np.testing.assert_allclose(r["batch_sum"], rows.sum())
    np.testing.assert_allclose(r["psum"], rows.sum(axis=0))
    np.testing.assert_allclose(r["param_sum"], np.arange(32.0).sum())
