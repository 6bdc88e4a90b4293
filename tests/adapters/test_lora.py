"""LoRA: targets, init, merge/unmerge, gradients, the frozen base under optax masking, and the PEFT layout
checked against the peft library itself (logits of PeftModel on the exported adapter)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab import hf
from jaxlab.adapters import lora
from jaxlab.models import transformer as tfm
from jaxlab.nn import axes

CFG = tfm.Config.tiny()


def _base():
  return tfm.init(CFG, jax.random.key(0))


def _random_adapter(cfg, base, seed=1):
  """An adapter with both factors random (B = 0 at init would hide every bug of B)."""
  ad = lora.init(cfg, base, jax.random.key(seed))
  keys = iter(jax.random.split(jax.random.key(seed + 100), 2 * len(ad)))
  return {p: {n: 0.1 * jax.random.normal(next(keys), x.shape) for n, x in leaf.items()} for p, leaf in ad.items()}


def test_targets_resolve_shortcuts_and_regexes():
  base = _base()
  assert list(lora.target_paths(base, ("q", "v"))) == ["layers/attn/q/kernel", "layers/attn/v/kernel"]
  assert list(lora.target_paths(base, (r"layers/mlp/(gate|up)/kernel",))) == [
      "layers/mlp/gate/kernel", "layers/mlp/up/kernel"]
  assert len(lora.target_paths(base, lora.ALL_LINEAR)) == 7
  assert lora.target_paths(base, ("all-linear",)) == lora.target_paths(base, lora.ALL_LINEAR)
  with pytest.raises(ValueError, match="matched no parameter"):
    lora.target_paths(base, ("qq_proj",))
  with pytest.raises(ValueError, match="kernel"):
    lora.target_paths(base, ("final_norm/scale",))


def test_init_shapes_axes_and_peft_distribution():
  import torch
  from peft import LoraConfig, get_peft_model
  from transformers import LlamaConfig, LlamaForCausalLM

  base = _base()
  cfg = lora.Config(rank=8, alpha=16, targets=("q", "down"))
  ad = lora.init(cfg, base, jax.random.key(3))
  q, down = ad["layers/attn/q/kernel"], ad["layers/mlp/down/kernel"]
  assert q["lora_a"].shape == (2, 64, 8) and q["lora_b"].shape == (2, 8, 64)
  assert down["lora_a"].shape == (2, 176, 8) and not np.any(np.asarray(down["lora_b"]))
  names = axes.logical_axes(ad, lora.axis_rules(tfm.AXES))
  assert names["layers/attn/q/kernel"] == {"lora_a": ("layers", "embed", "rank"),
                                           "lora_b": ("layers", "rank", "q_heads")}
  assert names["layers/mlp/down/kernel"]["lora_a"] == ("layers", "mlp", "rank")
  assert cfg.scale == 2.0 and cfg.replace(rslora=True).scale == 16 / math.sqrt(8)

  torch.manual_seed(0)
  hf_cfg = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=176, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2)
  pm = get_peft_model(LlamaForCausalLM(hf_cfg), LoraConfig(r=8, target_modules=["q_proj", "down_proj"]))
  for name, fan_in, ours in [("q_proj", 64, q["lora_a"]), ("down_proj", 176, down["lora_a"])]:
    theirs = [p for n, p in pm.named_parameters() if f"{name}.lora_A" in n][0].detach().numpy()
    bound = 1 / math.sqrt(fan_in)  # kaiming-uniform a=sqrt(5)
    for w in (np.asarray(ours), theirs):
      assert np.abs(w).max() <= bound + 1e-7 and np.abs(w).max() > 0.95 * bound
      assert abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound


def test_merge_matches_float64_oracle_and_unmerged_linear():
  base = _base()
  cfg = lora.Config(rank=4, alpha=8, targets=("q", "o", "up"))
  ad = _random_adapter(cfg, base)
  merged = lora.merge(base, ad, cfg)
  for path, leaf in ad.items():
    w = np.asarray(lora.get_path(base, path), np.float64)
    a, b = np.asarray(leaf["lora_a"], np.float64), np.asarray(leaf["lora_b"], np.float64)
    want = w + cfg.scale * np.einsum("lir,lro->lio", a, b)
    np.testing.assert_allclose(np.asarray(lora.get_path(merged, path)), want, atol=1e-6)
    x = jax.random.normal(jax.random.key(5), (3, w.shape[1]))
    layer0 = {n: v[0] for n, v in leaf.items()}
    np.testing.assert_allclose(lora.linear(lora.get_path(base, path)[0], layer0, x, cfg.scale),
                               x @ lora.get_path(merged, path)[0], atol=1e-5)
  untouched = lora.flatten(merged)
  for path, x in lora.flatten(base).items():
    if path not in ad:
      assert untouched[path] is x
  back = lora.unmerge(merged, ad, cfg)
  for path in ad:
    np.testing.assert_allclose(lora.get_path(back, path), lora.get_path(base, path), atol=1e-6)
  bf = jax.tree.map(lambda x: x.astype(jnp.bfloat16), base)
  assert lora.get_path(lora.merge(bf, ad, cfg), "layers/attn/q/kernel").dtype == jnp.bfloat16


def test_adapter_gradients_follow_the_chain_rule():
  """dL/dA^T = s G B^T and dL/dB^T = s A G where G = dL/dkernel at the merged point."""
  base = _base()
  cfg = lora.Config(rank=4, alpha=8, targets=("v",))
  ad = _random_adapter(cfg, base)
  tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, CFG.vocab_size)

  def loss_params(p):
    return jnp.mean(tfm.forward(p, tokens, CFG).logits ** 2)

  g_ad = jax.grad(lambda a: loss_params(lora.merge(base, a, cfg)))(ad)["layers/attn/v/kernel"]
  g_w = lora.get_path(jax.grad(loss_params)(lora.merge(base, ad, cfg)), "layers/attn/v/kernel")
  a, b = ad["layers/attn/v/kernel"]["lora_a"], ad["layers/attn/v/kernel"]["lora_b"]
  np.testing.assert_allclose(g_ad["lora_a"], cfg.scale * jnp.einsum("lio,lro->lir", g_w, b), rtol=1e-4, atol=1e-9)
  np.testing.assert_allclose(g_ad["lora_b"], cfg.scale * jnp.einsum("lir,lio->lro", a, g_w), rtol=1e-4, atol=1e-9)


def test_masked_optimizer_freezes_base_and_matches_adapter_only_training():
  base = _base()
  cfg = lora.Config(rank=4, alpha=8, targets=("q", "v"))
  params = {"base": base, "adapter": _random_adapter(cfg, base)}
  tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, CFG.vocab_size)

  def loss(p):
    return jnp.mean(tfm.forward(lora.merge(p["base"], p["adapter"], cfg), tokens, CFG).logits ** 2)

  inner = optax.adamw(1e-2, weight_decay=0.1)
  tx = lora.masked(inner, params, (r"^adapter/",))
  labels = jax.tree.leaves(lora.labels(params, (r"^adapter/",)))
  assert labels.count("trainable") == 4 and "frozen" in labels
  grads = jax.grad(loss)(params)
  assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads["base"]))
  updates, _ = tx.update(grads, tx.init(params), params)
  new = optax.apply_updates(params, updates)
  for x, y in zip(jax.tree.leaves(new["base"]), jax.tree.leaves(base)):
    np.testing.assert_array_equal(x, y)
  ref_updates, _ = inner.update(grads["adapter"], inner.init(params["adapter"]), params["adapter"])
  ref = optax.apply_updates(params["adapter"], ref_updates)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), new["adapter"], ref)
  assert not np.allclose(new["adapter"]["layers/attn/q/kernel"]["lora_a"],
                         params["adapter"]["layers/attn/q/kernel"]["lora_a"])


@pytest.mark.parametrize("cfg", [lora.Config(rank=4, alpha=8, targets=lora.ALL_LINEAR, rslora=True),
                                 lora.Config(rank=2, alpha=16, targets=("q", "v"))], ids=["all-rs", "qv"])
def test_peft_export_loads_in_peft_with_equal_logits(tmp_path, cfg):
  import torch
  from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
  from transformers import AutoModelForCausalLM

  base = _base()
  ad = _random_adapter(cfg, base)
  hf.save(str(tmp_path / "base"), CFG, base)
  lora.export_peft(str(tmp_path / "lora"), ad, cfg, CFG)

  torch.manual_seed(0)
  model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), dtype=torch.float32)
  names = {p: m.rsplit(".", 1)[-1] for p, (m, _) in lora._hf_modules(CFG).items()}
  ref = get_peft_model(model, LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, use_rslora=cfg.rslora,
                                         target_modules=sorted(names[p] for p in ad)))
  assert set(hf.io.read_file(str(tmp_path / "lora" / "adapter_model.safetensors"))) == set(
      get_peft_model_state_dict(ref))
  del ref

  model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), dtype=torch.float32)
  pm = PeftModel.from_pretrained(model, str(tmp_path / "lora")).eval()
  assert pm.base_model.model.model.layers[0].self_attn.q_proj.scaling["default"] == pytest.approx(cfg.scale)
  tokens = np.asarray(jax.random.randint(jax.random.key(7), (2, 12), 0, CFG.vocab_size))
  with torch.no_grad():
    theirs = pm(torch.tensor(tokens)).logits.numpy()
  ours = np.asarray(tfm.forward(lora.merge(base, ad, cfg), jnp.asarray(tokens), CFG).logits)
  plain = np.asarray(tfm.forward(base, jnp.asarray(tokens), CFG).logits)
  assert np.abs(ours - plain).max() > 1e-2  # the adapter matters
  np.testing.assert_allclose(ours, theirs, atol=1e-4)

  cfg2, ad2 = lora.import_peft(str(tmp_path / "lora"), CFG)
  assert (cfg2.rank, cfg2.alpha, cfg2.rslora) == (cfg.rank, cfg.alpha, cfg.rslora)
  assert lora.target_paths(base, cfg2.targets) == lora.target_paths(base, cfg.targets)
  jax.tree.map(np.testing.assert_array_equal, ad2, ad)


def test_sharded_adapter_forward_equals_single_device():
  """Adapter leaves carry the base kernel's logical axes, so they place on an fsdp x tensor mesh."""
  from jaxlab import sharding

  base = _base()
  cfg = lora.PRESETS["all"]
  ad = _random_adapter(cfg, base)
  mesh = sharding.make_mesh("fsdp:4,tensor:2")
  rules = lora.axis_rules(tfm.AXES)
  sb, sa = (sharding.shard_params(t, mesh, "fsdp_tp", axes=rules) for t in (base, ad))
  assert sa["layers/attn/q/kernel"]["lora_b"].sharding.spec == jax.sharding.PartitionSpec(None, None, "tensor")
  tokens = jax.random.randint(jax.random.key(2), (8, 16), 0, CFG.vocab_size)
  fwd = jax.jit(lambda b, a, t: tfm.forward(lora.merge(b, a, cfg), t, CFG).logits)
  np.testing.assert_allclose(fwd(sb, sa, tokens), fwd(base, ad, tokens), atol=1e-5)
