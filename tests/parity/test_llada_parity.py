"""LLaDA-format checkpoints: logits (full, prefix-cache and dual-cache forwards) equal the public LLaDA modeling
code, and Dream-format checkpoints equal transformers' Qwen2 run bidirectionally with Dream's logit shift.

The LLaDA reference numbers below were produced by `python tests/parity/test_llada_parity.py --regenerate DIR`,
where DIR holds llada/model/{__init__,configuration_llada,modeling_llada}.py of NVlabs/Fast-dLLM at commit
24cc59e75f20a6384bae8c905965bb090b96388e (torch 2.13.0 CPU, float32, torch.compile disabled, `einops`
stubbed: it is imported but unused on this path). `_reference` below is that script: it builds
LLaDAModelLM from the configs in CASES, loads the seeded NumPy weights of `llada_tensors`, and records
  full:   model(x_a).logits
  prefix: model(x_b[:, S:], past_key_values=<KV of model(x_a) cut to the first S positions>).logits
  dual:   model(x_b[:, S:E], past_key_values=<KV of model(x_a)>, replace_position=[S, E)).logits
(the forwards of Fast-dLLM's generate_with_prefix_cache / generate_with_dual_cache). The test rebuilds the
same weights and tokens from the seeds, writes them as a LLaDA-format directory, reads it with `hf.load` and
compares.
"""
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxlab import hf
from jaxlab.generate import diffusion
from jaxlab.hf import io, llada
from jaxlab.models import mdm

COMMON = dict(block_type="llama", layer_norm_type="rms", rope=True, activation_type="silu", rms_norm_eps=1e-5,
              max_sequence_length=64, alibi=False, include_bias=False, bias_for_layer_norm=False,
              attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0, flash_attention=False,
              init_device="cpu", model_type="llada", architectures=["LLaDAModelLM"])
CASES = {
    "gqa_untied_qkv_bias": dict(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=48,
                                vocab_size=40, embedding_size=48, weight_tying=False, include_qkv_bias=True,
                                rope_theta=500000.0, mask_token_id=39, eos_token_id=38, pad_token_id=38),
    "mha_tied": dict(d_model=32, n_heads=2, n_kv_heads=2, n_layers=2, mlp_hidden_size=40, vocab_size=48,
                     embedding_size=48, weight_tying=True, include_qkv_bias=False, rope_theta=10000.0,
                     mask_token_id=47, eos_token_id=46, pad_token_id=46),
}
B, L, S, E = 2, 7, 3, 5


def llada_config(name):
  return {**COMMON, **CASES[name]}


def llada_tensors(c: dict, seed: int) -> dict:
  """Seeded random weights under LLaDA's own parameter names ([out, in] Linear layout)."""
  rng = np.random.RandomState(seed)
  d, hd = c["d_model"], c["d_model"] // c["n_heads"]
  kv, f, v = c["n_kv_heads"] * hd, c["mlp_hidden_size"], c["embedding_size"]
  shapes = {"model.transformer.wte.weight": (v, d), "model.transformer.ln_f.weight": (d,)}
  for i in range(c["n_layers"]):
    p = f"model.transformer.blocks.{i}."
    shapes.update({p + "attn_norm.weight": (d,), p + "ff_norm.weight": (d,), p + "q_proj.weight": (d, d),
                   p + "k_proj.weight": (kv, d), p + "v_proj.weight": (kv, d), p + "attn_out.weight": (d, d),
                   p + "ff_proj.weight": (f, d), p + "up_proj.weight": (f, d), p + "ff_out.weight": (d, f)})
    if c["include_qkv_bias"]:
      shapes.update({p + "q_proj.bias": (d,), p + "k_proj.bias": (kv,), p + "v_proj.bias": (kv,)})
  if not c["weight_tying"]:
    shapes["model.transformer.ff_out.weight"] = (v, d)
  out = {}
  for name in sorted(shapes):
    noise = rng.standard_normal(shapes[name])
    out[name] = (1.0 + 0.3 * noise if "norm" in name or "ln_f" in name else 0.2 * noise).astype(np.float32)
  return out


def llada_tokens(c: dict, seed: int):
  rng = np.random.RandomState(seed)
  x_a = rng.randint(0, c["vocab_size"], (B, L))
  x_a[rng.rand(B, L) < 0.4] = c["mask_token_id"]
  x_b = x_a.copy()
  x_b[:, S:E] = rng.randint(0, c["vocab_size"], (B, E - S))
  return x_a.astype(np.int32), x_b.astype(np.int32)


def _reference(model_dir: str):
  os.environ["TORCHDYNAMO_DISABLE"] = "1"
  import types
  import torch
  sys.modules.setdefault("einops", types.SimpleNamespace(rearrange=None))
  sys.path.insert(0, os.path.dirname(os.path.abspath(model_dir)))
  from model.configuration_llada import LLaDAConfig
  from model.modeling_llada import LLaDAModelLM
  results = {}
  for seed, name in enumerate(CASES):
    c = llada_config(name)
    model = LLaDAModelLM(LLaDAConfig(**c), init_params=False).eval()
    sd = {k: torch.from_numpy(v) for k, v in llada_tensors(c, seed).items()}
    if c["weight_tying"]:
      sd.pop("model.transformer.ff_out.weight", None)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    x_a, x_b = (torch.from_numpy(t).long() for t in llada_tokens(c, seed))
    with torch.no_grad():
      out = model(x_a, use_cache=True)
      past = out.past_key_values
      prefix = [tuple(t[:, :, :S] for t in layer) for layer in past]
      pre = model(x_b[:, S:], past_key_values=prefix, use_cache=True).logits
      rp = torch.zeros((1, L), dtype=torch.bool)  # one row: its nonzero() indexes positions
      rp[:, S:E] = True
      full_past = [tuple(t.clone() for t in layer) for layer in past]
      dual = model(x_b[:, S:E], past_key_values=full_past, use_cache=True, replace_position=rp).logits
    results[name] = {"full": out.logits, "prefix": pre, "dual": dual}
  np.set_printoptions(precision=5, suppress=True, threshold=10**6, linewidth=116, floatmode="fixed")
  for name, r in results.items():
    for k, v in r.items():
      # One row per position: 6 logits (the first, the ids [mask-1, mask], ...) keep the literal small.
      print(f"{name}/{k}", repr(_digest(v.float().numpy(), llada_config(name)["mask_token_id"])))


def _digest(logits: np.ndarray, mask_id: int) -> np.ndarray:
  """A fixed slice of the logits plus per-position sums over the whole vocab (every column counts)."""
  cols = [0, 1, 7, mask_id - 1, mask_id]
  return np.concatenate([logits[..., cols], logits.sum(-1, keepdims=True),
                         (logits ** 2).sum(-1, keepdims=True)], axis=-1)


REFERENCE = {  # printed by _reference (see the module docstring); [B, T, 7] per entry
    "gqa_untied_qkv_bias/full": np.array([
        [
            [-1.07775, 0.06527, -2.41183, 2.89056, -0.00185, 5.21276, 107.60103],
            [-0.66424, 0.40957, -1.14414, -0.36229, 0.52931, -9.36520, 49.10978],
            [-0.70452, 0.01526, -1.47947, -0.07522, 0.53364, -9.98561, 54.78484],
            [-1.16639, 0.15981, -1.26979, 1.86213, 0.09938, -0.38019, 81.90767],
            [-1.27700, 0.04505, -1.38237, 2.85919, 0.40076, 2.89818, 91.93036],
            [-1.44443, -0.00940, -1.37048, 2.92087, 0.59391, 2.08648, 96.19952],
            [-0.86203, 0.11709, -1.56378, 1.04565, 0.55275, -6.00980, 75.14241],
        ],
        [
            [0.15760, 0.88605, 0.47524, 1.09926, -0.00668, -6.70047, 38.95394],
            [0.79710, -0.36054, -0.49299, -0.51873, 0.01698, -15.10772, 70.94508],
            [0.30989, 0.34385, 0.38736, 0.94714, -0.74617, -6.80298, 51.82721],
            [-0.43160, 1.43329, 0.60946, 1.67346, 0.93344, -8.65330, 64.57019],
            [-0.57550, 1.35793, 0.66396, 1.75154, 0.30238, -10.00270, 67.45151],
            [-0.22181, 0.04740, -0.65402, 0.81820, -1.22986, -7.38999, 51.85468],
            [0.47838, 0.71472, 1.12714, 0.66643, 0.32140, -19.81854, 73.65395],
        ],
    ]),
    "gqa_untied_qkv_bias/prefix": np.array([
        [
            [-0.47444, 0.77447, 0.02780, -0.25170, 0.87192, -0.17530, 68.48209],
            [-1.23455, 0.12406, -1.36916, 2.88147, 0.25370, 4.51251, 88.29181],
            [-1.37896, -0.02222, -1.50530, 2.87754, 0.60301, 0.85862, 100.69913],
            [-0.70701, -0.29722, -1.64895, 0.99970, 0.99503, -10.37691, 90.67946],
        ],
        [
            [0.09426, 1.08781, 0.91024, 1.96407, 1.52506, -9.07622, 96.22820],
            [-0.32897, -0.38573, -0.15097, 0.08071, 0.95744, -7.22724, 81.32536],
            [-0.29123, 0.19110, -0.00594, 0.80220, -0.44617, -8.20192, 70.66760],
            [0.16897, -0.25256, 0.74531, -0.51669, 1.03963, -12.15112, 79.92279],
        ],
    ]),
    "gqa_untied_qkv_bias/dual": np.array([
        [
            [-0.47178, 0.74895, 0.00699, -0.19050, 0.84225, 0.05386, 67.51830],
            [-1.19625, 0.07459, -1.32805, 2.74048, 0.37776, 4.45949, 85.21513],
        ],
        [
            [0.18866, 1.10619, 1.23568, 1.82431, 1.27187, -7.80290, 92.26357],
            [-0.23302, -0.22055, -0.27043, -0.05573, 1.03346, -8.10605, 79.73808],
        ],
    ]),
    "mha_tied/full": np.array([
        [
            [-2.49712, -0.15489, 0.79132, -0.43913, 2.98139, 8.24736, 56.19707],
            [-0.93394, 0.61721, -0.87290, 1.67475, 2.87823, 4.57120, 73.65363],
            [-0.97859, 0.81979, 1.02792, 1.93824, 2.64506, 10.05268, 62.87023],
            [-1.85231, 0.71016, -0.16315, 1.35873, 3.70970, 4.99793, 89.43484],
            [-1.41249, 0.20494, -0.59853, 0.01146, 2.33728, -9.00829, 45.97261],
            [-1.08272, 0.86709, -1.46916, -0.34657, 2.45531, -7.37593, 59.04004],
            [-2.65691, 0.80896, 0.41815, 1.37174, 3.23193, 5.92962, 86.03246],
        ],
        [
            [-1.17795, -0.16663, 0.44946, -0.75406, -1.39880, -6.45462, 81.54414],
            [-0.22481, -0.06524, 1.09840, 1.35180, -1.50257, -2.06396, 87.39838],
            [-0.78021, -0.34709, 1.07232, -0.97578, -0.29757, -3.95438, 66.08802],
            [-0.30028, 1.09034, 0.46304, 0.54351, 0.33711, -5.28844, 77.14116],
            [-0.18099, -0.52478, -1.14398, 0.90911, 0.54729, -9.49911, 42.72783],
            [-0.59503, 0.13091, 1.46020, -0.84409, 0.00195, 0.45392, 96.99955],
            [-1.34196, -0.93894, 0.46730, -0.59816, 2.51260, -0.58987, 68.24956],
        ],
    ]),
    "mha_tied/prefix": np.array([
        [
            [-1.10901, -0.36559, 1.21843, -1.12372, -1.02652, 11.95683, 78.59804],
            [-0.10322, 0.65790, 1.51343, -0.44052, -0.95415, 6.34634, 68.24860],
            [-0.47275, 1.10460, -1.06061, -1.08881, -0.57186, -2.67097, 70.89773],
            [-2.21158, 0.46693, 0.65516, -0.24583, 0.54328, 1.31073, 55.03597],
        ],
        [
            [-0.34449, 0.84864, 0.18754, 0.65460, 0.14128, -6.11435, 65.80266],
            [-0.12227, -0.67721, 1.08506, 1.53961, -0.71932, -2.09867, 73.52359],
            [-1.23830, -0.70591, 1.08712, -1.87703, -0.28029, -0.27929, 109.61256],
            [-0.25790, -0.21594, -0.02668, -1.20577, -0.83326, -3.19840, 99.85771],
        ],
    ]),
    "mha_tied/dual": np.array([
        [
            [-0.54503, 0.00678, 1.07939, -0.97712, -1.56235, 7.88129, 73.50030],
            [0.21857, 0.61608, 1.47138, -0.48845, -1.62650, 4.40929, 67.76718],
        ],
        [
            [-0.48815, 1.47550, 0.43925, 0.87861, 0.35556, -7.52807, 76.49927],
            [-0.34358, -0.25781, 1.33033, 1.79959, -0.45973, -3.13018, 77.96410],
        ],
    ]),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
  name = request.param
  c = llada_config(name)
  path = str(tmp_path_factory.mktemp(name))
  io.write_dir(path, llada_tensors(c, list(CASES).index(name)), 2**30)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(c, f)
  cfg, params = hf.load(path)
  return name, c, path, cfg, params


def test_config_from_llada(case):
  name, c, _, cfg, params = case
  assert isinstance(cfg, mdm.Config) and not cfg.causal and not cfg.shift_logits
  assert (cfg.vocab_size, cfg.d_model, cfg.kv_heads, cfg.d_ff) == (c["embedding_size"], 32, c["n_kv_heads"],
                                                                     c["mlp_hidden_size"])
  assert cfg.mask_token_id == c["mask_token_id"] and cfg.tie_embeddings == c["weight_tying"]
  assert cfg.text_vocab_size == (c["vocab_size"] if c["vocab_size"] != c["embedding_size"] else None)
  assert ("lm_head" in params) != c["weight_tying"]


def test_logits_match_reference(case):
  name, c, _, cfg, params = case
  x_a, x_b = llada_tokens(c, list(CASES).index(name))
  mid = c["mask_token_id"]
  got = {"full": np.asarray(mdm.forward(params, x_a, cfg).logits)}
  valid = jnp.ones((B, L), bool)
  pos = diffusion.positions(valid)
  _, cache = diffusion.refresh_cache(params, cfg, jnp.asarray(x_a), valid, pos, L - S)
  ctx = diffusion.exclude(cache, S, L - S)
  got["prefix"] = np.asarray(diffusion.region_logits(params, cfg, ctx, x_b[:, None, S:], pos[:, S:],
                                                     valid[:, S:])[:, 0])
  _, cache = diffusion.refresh_cache(params, cfg, jnp.asarray(x_a), valid, pos, E - S)
  ctx = diffusion.exclude(cache, S, E - S)
  got["dual"] = np.asarray(diffusion.region_logits(params, cfg, ctx, x_b[:, None, S:E], pos[:, S:E],
                                                   valid[:, S:E])[:, 0])
  for k, v in got.items():
    np.testing.assert_allclose(_digest(v, mid), REFERENCE[f"{name}/{k}"], atol=2e-4, rtol=2e-5, err_msg=k)
  # The cached forwards really differ from a full forward of x_b (stale KV), so the check has teeth.
  full_b = np.asarray(mdm.forward(params, x_b, cfg).logits)
  assert np.abs(full_b[:, S:] - got["prefix"]).max() > 1e-3


def test_save_load_round_trip(case, tmp_path):
  name, c, path, cfg, params = case
  out = str(tmp_path / "again")
  hf.save(out, cfg, params)
  with open(os.path.join(out, "config.json")) as f:
    d = json.load(f)
  assert d["model_type"] == "llada" and d["architectures"] == ["LLaDAModelLM"]
  for k in ("d_model", "n_heads", "n_kv_heads", "mlp_hidden_size", "vocab_size", "embedding_size",
            "weight_tying", "include_qkv_bias", "mask_token_id", "rope_theta", "block_type"):
    assert d[k] == c[k], k
  assert sorted(io.read_dir(out)) == sorted(io.read_dir(path))
  cfg2, params2 = hf.load(out)
  assert cfg2 == cfg
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_unsupported_llada_settings_fail_by_name(tmp_path):
  c = {**llada_config("mha_tied"), "block_type": "sequential", "activation_type": "swiglu"}
  with pytest.raises(NotImplementedError, match="block_type.*activation_type"):
    llada.config_from_hf(c)


def test_dream_format_matches_qwen2_bidirectional_with_shift(tmp_path):
  hf_cfg = transformers.Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
  torch.manual_seed(3)
  model = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").eval()
  with torch.no_grad():  # every parameter random (norm scales around 1), so no mapping hides behind 1s/0s
    for name, p in model.named_parameters():
      p.copy_(1.0 + 0.3 * torch.randn(p.shape) if "norm" in name else 0.15 * torch.randn(p.shape))
  src = str(tmp_path / "qwen2")
  model.save_pretrained(src)
  with open(os.path.join(src, "config.json")) as f:
    d = json.load(f)
  d.update(model_type="Dream", architectures=["DreamModel"], mask_token_id=127)
  with open(os.path.join(src, "config.json"), "w") as f:
    json.dump(d, f)
  cfg, params = hf.load(src)
  assert cfg.shift_logits and not cfg.causal and cfg.qkv_bias and llada.layout(cfg) == "dream"
  toks = np.random.RandomState(0).randint(0, 128, (2, 9))
  with torch.no_grad():  # a 4D float mask of zeros = full (bidirectional) attention in eager attention
    raw = model(torch.as_tensor(toks), attention_mask=torch.zeros(2, 1, 9, 9), use_cache=False).logits.numpy()
  want = np.concatenate([raw[:, :1], raw[:, :-1]], axis=1)
  np.testing.assert_allclose(np.asarray(mdm.forward(params, toks, cfg).logits), want, atol=1e-4, rtol=0)
  causal = model(torch.as_tensor(toks), use_cache=False).logits.detach().numpy()
  assert np.abs(causal[:, :-1] - raw[:, :-1]).max() > 1e-3  # the mask really made it bidirectional
  out = str(tmp_path / "dream")
  hf.save(out, cfg, params)
  cfg2, params2 = hf.load(out)
  assert cfg2 == cfg and json.load(open(os.path.join(out, "config.json")))["model_type"] == "Dream"
  np.testing.assert_array_equal(np.asarray(mdm.forward(params2, toks, cfg2).logits),
                                np.asarray(mdm.forward(params, toks, cfg).logits))


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == "--regenerate":
    _reference(sys.argv[2])
  else:
    print(f"usage: python {sys.argv[0]} --regenerate DIR_WITH_FAST_DLLM_llada/model")
