"""Logical axis rules: values a model family exports, composed by wrappers, with nothing registered globally."""
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from jaxlab.nn import axes


def test_rules_look_up_the_last_match_and_prepend_layers():
  base = axes.rules((r"mlp/(gate|up)/kernel", ("embed", "mlp"), "embed"), (r"norm/scale", ("embed",)))
  refined = base + axes.rules((r"mlp/up/kernel", ("embed", "heads"), "embed"))
  assert base.lookup("layers/mlp/up/kernel", 3) == axes.Axes(("layers", "embed", "mlp"), "embed")
  assert refined.lookup("layers/mlp/up/kernel", 3) == axes.Axes(("layers", "embed", "heads"), "embed")
  assert refined.lookup("layers/mlp/gate/kernel", 2) == axes.Axes(("embed", "mlp"), "embed")
  assert refined.lookup("norm/scale", 1).names == ("embed",)
  assert base + base == base and len((base + refined).entries) == 3  # a rule already present keeps its place
  assert hash(base) == hash(axes.rules(*((r.pattern, r.axes.names, r.axes.fan_in) for r in base.entries)))
  with pytest.raises(ValueError, match="has 1 dims, its axes"):
    base.lookup("mlp/up/kernel", 1)
  with pytest.raises(ValueError, match="fan_in 'vocab' is not one of"):
    axes.rules(("w", ("embed",), "vocab"))


def test_uncovered_leaf_and_missing_rules_fail_in_one_line():
  rules = axes.rules(("a/w", ("embed", "mlp"), "embed"))
  tree = {"a": {"w": jnp.zeros((2, 3))}, "b": {"w": jnp.zeros((3,))}}
  with pytest.raises(KeyError, match="no logical axes for parameter 'b/w'") as e:
    axes.logical_axes(tree, rules)
  assert "\n" not in str(e.value)
  assert axes.fan_in_axes({"a": tree["a"]}, rules) == {"a": {"w": 0}}
  with pytest.raises(TypeError, match="logical_axes needs the params' logical axis rules"):
    axes.logical_axes(tree, None)


_FRESH = """
import json, importlib
import jax
from jaxlab.nn import axes
before = dict(vars(axes))
from jaxlab.models import transformer as tfm
rules = tfm.AXES
shapes = jax.eval_shape(lambda: tfm.init(tfm.Config.tiny(), jax.random.key(0)))
out = {"q": axes.logical_axes(shapes, tfm.AXES)["layers"]["attn"]["q"]["kernel"],
       "fan_in": axes.fan_in_axes(shapes, tfm.AXES)["embed"]["embedding"]}
try:
  axes.logical_axes({**shapes, "mystery": {"w": jax.ShapeDtypeStruct((2, 3), "float32")}}, tfm.AXES)
except KeyError as e:
  out["error"] = str(e)
for name in ("vit", "encoder", "whisper", "gnn", "heads", "qformer", "video", "pointcloud", "multimodal",
             "program_predictor", "vlm", "mdm", "nnx_bridge"):
  importlib.import_module("jaxlab.models." + name)
for name in ("jaxlab.interp.probes", "jaxlab.adapters.lora", "jaxlab.adapters.kron", "jaxlab.sharding",
             "jaxlab.optim", "jaxlab.train"):
  importlib.import_module(name)
out["unchanged"] = dict(vars(axes)) == before and tfm.AXES is rules
out["same_after_imports"] = axes.logical_axes(shapes, tfm.AXES)["layers"]["attn"]["q"]["kernel"] == out["q"]
print(json.dumps(out))
"""


def test_importing_model_modules_changes_nothing_global():
  """In a fresh process the transformer's rules alone name its params; importing every other family changes
  neither `jaxlab.nn.axes` nor those rules."""
  proc = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["q"] == ["layers", "embed", "q_heads"] and out["fan_in"] == 0
  assert "no logical axes for parameter 'mystery/w'" in out["error"] and "\n" not in out["error"]
  assert out["unchanged"] and out["same_after_imports"]
  assert not hasattr(axes, "register") and not hasattr(axes, "_RULES")


def test_every_family_covers_its_own_params():
  from jaxlab.adapters import kron, lora
  from jaxlab.interp import probes
  from jaxlab.models import (encoder, gnn, heads, multimodal as mm, pointcloud, program_predictor, qformer,
                             transformer as tfm, video, vit, vlm, whisper)
  key = jax.random.key(0)
  shape = lambda f, cfg: jax.eval_shape(lambda: f(cfg, key))
  for mod in (tfm, vit, encoder, whisper, pointcloud, qformer, video, program_predictor, gnn):
    cfg = next(iter(mod.PRESETS.values()))
    axes.logical_axes(shape(mod.init, cfg), mod.AXES)
  axes.logical_axes(shape(heads.init, heads.Config(kind="step")), heads.AXES)
  axes.logical_axes(shape(probes.init, probes.Config(d_model=8, kind="length")), probes.AXES)
  axes.logical_axes(shape(vlm.init, vlm.Config()), vlm.AXES)
  for enc, enc_cfg in ((mm.VIT, mm.VitFeatures()), (mm.WHISPER, mm.WhisperFeatures()), (mm.LINEAR, mm.LinearFeatures()),
                       (qformer.QFORMER, qformer.PRESETS["tiny"])):
    cfg = mm.Config(encoder=enc, encoder_cfg=enc_cfg, mode="prefix", n_latents=2)
    axes.logical_axes(shape(mm.init, cfg), mm.axis_rules(cfg))
  base = shape(tfm.init, tfm.Config.tiny())
  ad = jax.eval_shape(lambda: lora.init(lora.PRESETS["all"], base, key))
  names = axes.logical_axes({"base": base, "adapter": ad}, lora.axis_rules(tfm.AXES))
  assert names["adapter"]["layers/mlp/down/kernel"] == {"lora_a": ("layers", "mlp", "rank"),
                                                        "lora_b": ("layers", "rank", "embed")}
  kad = jax.eval_shape(lambda: kron.init(kron.Config(r=2, r1=2, r2=2), base, key))
  assert kron.axis_rules(tfm.AXES) == tfm.AXES + kron.AXES
  axes.logical_axes({"base": base, "adapter": kad}, kron.axis_rules(tfm.AXES))
  with pytest.raises(KeyError, match=r"no logical axes for parameter 'adapter/layers/\S+/lora_a'"):
    axes.logical_axes({"adapter": ad}, tfm.AXES)
