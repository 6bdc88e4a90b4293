"""jaxlab.hf checkpoint IO: exact save/load round trips (fp32, bf16, sharded) and clear errors on bad input.

Oracles: the `safetensors` library as an independent reader and writer of the files, the HF tensor layout
(Linear weights stored [out, in]), and bitwise equality of round-tripped params.
"""
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxlab import hf
from jaxlab.models import transformer as tfm
from jaxlab.nn.rope import Rope

BASE = tfm.Config.tiny(vocab_size=128, d_ff=96, max_position_embeddings=64)
CONFIGS = {
    "llama_tied": BASE.replace(tie_embeddings=True, bos_token_id=0, eos_token_id=(1, 2)),
    "llama_biases_llama3": BASE.replace(qkv_bias=True, o_bias=True, mlp_bias=True, rope=Rope(
        type="llama3", theta=50000.0, factor=8.0, original_max_position_embeddings=32)),
    "mistral": BASE.replace(sliding_window=5),
    "qwen2_yarn": BASE.replace(qkv_bias=True, rope=Rope(type="yarn", factor=4.0,
                                                        original_max_position_embeddings=32)),
    "qwen3": BASE.replace(qk_norm="head", head_dim=24),
    "olmo2": BASE.replace(post_norm=True, qk_norm="full", norm_eps=1e-5),
}
Q0 = "model.layers.0.self_attn.q_proj.weight"


def _params(cfg, seed=0):
  shapes = jax.eval_shape(lambda: tfm.init(cfg, jax.random.key(0)))
  rng = np.random.RandomState(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape).astype(np.float32)), shapes)


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A saved llama checkpoint: (path, cfg, params)."""
  path = str(tmp_path_factory.mktemp("llama"))
  params = _params(BASE)
  hf.save(path, BASE, params)
  return path, BASE, params


def _rewrite(src, dst, edit_tensors=None, edit_config=None):
  """A copy of checkpoint `src` with its tensors / config passed through the edit functions."""
  os.makedirs(dst)
  tensors = load_file(os.path.join(src, "model.safetensors"))
  save_file(edit_tensors(tensors) if edit_tensors else tensors, os.path.join(dst, "model.safetensors"))
  with open(os.path.join(src, "config.json")) as f:
    d = json.load(f)
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(edit_config(d) if edit_config else d, f)
  return dst


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fp32_round_trip_is_exact(tmp_path, name):
  cfg = CONFIGS[name]
  params = _params(cfg)
  hf.save(str(tmp_path), cfg, params)
  cfg2, params2 = hf.load(str(tmp_path))
  assert cfg2 == cfg
  _assert_trees_equal(params2, params)


def test_files_follow_hf_layout(saved):
  path, cfg, params = saved
  t = load_file(os.path.join(path, "model.safetensors"))  # read by the safetensors library, not jaxlab
  lp = params["layers"]
  np.testing.assert_array_equal(t[Q0], np.asarray(lp["attn"]["q"]["kernel"][0]).T)
  np.testing.assert_array_equal(t["model.layers.1.self_attn.k_proj.weight"], np.asarray(lp["attn"]["k"]["kernel"][1]).T)
  np.testing.assert_array_equal(t["model.layers.1.mlp.down_proj.weight"], np.asarray(lp["mlp"]["down"]["kernel"][1]).T)
  np.testing.assert_array_equal(t["model.layers.0.input_layernorm.weight"], np.asarray(lp["attn_norm"]["scale"][0]))
  np.testing.assert_array_equal(t["model.embed_tokens.weight"], np.asarray(params["embed"]["embedding"]))
  np.testing.assert_array_equal(t["lm_head.weight"], np.asarray(params["lm_head"]["kernel"]).T)
  assert len(t) == 3 + cfg.n_layers * 9 and all(v.dtype == np.float32 for v in t.values())
  with open(os.path.join(path, "config.json")) as f:
    d = json.load(f)
  assert d["model_type"] == "llama" and d["architectures"] == ["LlamaForCausalLM"]
  assert (d["hidden_size"], d["num_key_value_heads"], d["intermediate_size"]) == (64, 2, 96)


def test_bf16_round_trip_is_exact(tmp_path):
  cfg = CONFIGS["qwen3"]
  params = _params(cfg)
  hf.save(str(tmp_path), cfg, params, dtype=ml_dtypes.bfloat16)
  assert load_file(str(tmp_path / "model.safetensors"))[Q0].dtype == ml_dtypes.bfloat16
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["torch_dtype"] == "bfloat16"
  cfg2, params2 = hf.load(str(tmp_path))
  assert cfg2 == cfg.replace(param_dtype="bfloat16")
  want = jax.tree.map(lambda x: jnp.asarray(np.asarray(x).astype(ml_dtypes.bfloat16)), params)
  _assert_trees_equal(params2, want)
  hf.save(str(tmp_path / "again"), cfg2, params2)  # a bf16 checkpoint re-saved as is stays bitwise equal
  _assert_trees_equal(hf.load(str(tmp_path / "again"))[1], want)
  _, up = hf.load(str(tmp_path), dtype=jnp.float32)
  _assert_trees_equal(up, jax.tree.map(lambda x: x.astype(jnp.float32), want))


def test_reads_bf16_written_by_safetensors(saved, tmp_path):
  path, cfg, params = saved
  bf16 = lambda ts: {k: v.astype(ml_dtypes.bfloat16) for k, v in ts.items()}
  cfg2, params2 = hf.load(_rewrite(path, str(tmp_path / "bf16"), edit_tensors=bf16))
  assert cfg2.param_dtype == "bfloat16"
  _assert_trees_equal(params2, jax.tree.map(lambda x: jnp.asarray(np.asarray(x).astype(ml_dtypes.bfloat16)),
                                            params))


def test_sharded_save_writes_index_and_loads_back(tmp_path):
  cfg = CONFIGS["olmo2"]
  params = _params(cfg)
  hf.save(str(tmp_path), cfg, params, max_shard_bytes=64 * 1024)
  with open(tmp_path / "model.safetensors.index.json") as f:
    index = json.load(f)
  shards = sorted(set(index["weight_map"].values()))
  assert len(shards) > 2 and not (tmp_path / "model.safetensors").exists()
  total = 0
  for shard in shards:
    tensors = load_file(str(tmp_path / shard))
    assert {k for k, v in index["weight_map"].items() if v == shard} == set(tensors)
    assert sum(t.nbytes for t in tensors.values()) <= 64 * 1024 or len(tensors) == 1
    total += sum(t.nbytes for t in tensors.values())
  assert index["metadata"]["total_size"] == total == 4 * tfm.num_params(params)
  cfg2, params2 = hf.load(str(tmp_path))
  assert cfg2 == cfg
  _assert_trees_equal(params2, params)


def test_overwrite(saved, tmp_path):
  _, cfg, params = saved
  path = str(tmp_path)
  hf.save(path, cfg, params, max_shard_bytes=64 * 1024)
  with pytest.raises(FileExistsError, match="overwrite=True"):
    hf.save(path, cfg, _params(cfg, seed=1))
  _assert_trees_equal(hf.load(path)[1], params)  # the refused save left the checkpoint intact
  new = _params(cfg, seed=1)
  hf.save(path, cfg, new, overwrite=True)
  assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]  # old shards and index are gone
  _assert_trees_equal(hf.load(path)[1], new)


@pytest.mark.parametrize("case", ["missing", "unexpected", "misshaped"])
def test_checkpoint_mismatch_names_the_tensor(saved, tmp_path, case):
  path, _, _ = saved
  up = "model.layers.1.mlp.up_proj.weight"
  edits = {
      "missing": (lambda t: {k: v for k, v in t.items() if k != up},
                  rf"missing tensor {up} \(expected shape \(96, 64\)\)"),
      "unexpected": (lambda t: {**t, "model.layers.0.self_attn.extra.weight": np.zeros((3, 4), np.float32)},
                     r"unexpected tensor model.layers.0.self_attn.extra.weight \(shape \(3, 4\)\)"),
      "misshaped": (lambda t: {**t, Q0: np.zeros((64, 60), np.float32)},
                    rf"tensor {Q0}: expected shape \(64, 64\), found \(64, 60\)"),
  }
  edit, message = edits[case]
  with pytest.raises(ValueError, match=message):
    hf.load(_rewrite(path, str(tmp_path / case), edit_tensors=edit))


@pytest.mark.parametrize("kw", [dict(qk_norm="head", qkv_bias=True), dict(o_bias=True),
                                dict(qkv_bias=True, sliding_window=5), dict(qk_norm="head", sliding_window=5),
                                dict(post_norm=True, qk_norm="full", sliding_window=5)],
                         ids=["qwen3_qkv_bias_only", "o_bias_only", "qwen2_window", "qwen3_window", "olmo2_window"])
def test_config_no_hf_family_computes_is_refused_by_save(tmp_path, kw):
  """Saving must not write a checkpoint that transformers would run differently (or jaxlab could not load)."""
  cfg = BASE.replace(**kw)
  with pytest.raises(ValueError, match="bias|sliding"):
    hf.save(str(tmp_path), cfg, _params(cfg))
  assert not (tmp_path / "config.json").exists()


def test_config_shape_mismatch_is_reported(saved, tmp_path):
  path, _, _ = saved
  bad = _rewrite(path, str(tmp_path / "cfg"), edit_config=lambda d: {**d, "intermediate_size": 80})
  with pytest.raises(ValueError, match=r"mlp.up_proj.weight: expected shape \(80, 64\), found \(96, 64\)"):
    hf.load(bad)


def test_unknown_or_missing_model_type(saved, tmp_path):
  path, _, _ = saved
  with pytest.raises(ValueError, match="'gpt_bigfoot'"):
    hf.load(_rewrite(path, str(tmp_path / "a"), edit_config=lambda d: {**d, "model_type": "gpt_bigfoot"}))
  no_type = lambda d: {k: v for k, v in d.items() if k != "model_type"}
  with pytest.raises(ValueError, match="model_type"):
    hf.load(_rewrite(path, str(tmp_path / "b"), edit_config=no_type))


def test_missing_files(saved, tmp_path):
  path, _, _ = saved
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf.load(str(tmp_path))
  empty = tmp_path / "weights_gone"
  empty.mkdir()
  (empty / "config.json").write_text(open(os.path.join(path, "config.json")).read())
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    hf.load(str(empty))


def test_overwrite_into_a_new_directory(saved, tmp_path):
  _, cfg, params = saved
  path = str(tmp_path / "not" / "there" / "yet")
  hf.save(path, cfg, params, overwrite=True)
  _assert_trees_equal(hf.load(path)[1], params)


def test_save_after_an_interrupted_save_loads_the_new_weights(saved, tmp_path):
  """config.json is written last, so an interrupted sharded save leaves shards and an index without it."""
  _, cfg, params = saved
  path = str(tmp_path)
  hf.save(path, cfg, _params(cfg, seed=2), max_shard_bytes=64 * 1024)
  os.remove(os.path.join(path, "config.json"))
  hf.save(path, cfg, params)
  _assert_trees_equal(hf.load(path)[1], params)


@pytest.mark.parametrize("keep", ["data", "header", "4 bytes", "empty"])
def test_truncated_safetensors_raises(saved, tmp_path, keep):
  path, _, _ = saved
  bad = _rewrite(path, str(tmp_path / "t"))
  f = os.path.join(bad, "model.safetensors")
  size = os.path.getsize(f)
  n = {"data": size - 1000, "header": 100, "4 bytes": 4, "empty": 0}[keep]
  with open(f, "r+b") as fh:
    fh.truncate(n)
  with pytest.raises(ValueError, match=r"model\.safetensors.*(truncated|not a safetensors)"):
    hf.load(bad)
