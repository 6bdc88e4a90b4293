"""jaxlab.hf.reward: PRM checkpoints in the Qwen2.5-Math-PRM (step head, no lm_head) and Skywork-PRM (value head)
layouts, built here from a tiny random transformers Qwen2 plus torch heads laid out as those checkpoints' modeling
code lays them out (score = Sequential(Linear, ReLU, Linear); v_head.summary = Linear). jaxlab's rewards equal
torch's, and save writes back the same tensors under the same names."""
import json

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch
import torch

from jaxlab import hf
from jaxlab.hf import io, reward
from jaxlab.models import heads

D = 64


def _torch_head(kind: str, seed: int):
  torch.manual_seed(seed)
  if kind == "step":
    return torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.ReLU(), torch.nn.Linear(D, 2))
  return torch.nn.ModuleDict({"summary": torch.nn.Linear(D, 1)})


def _write_prm(make_hf_model, path, kind: str, tied: bool):
  lm = make_hf_model("qwen2", seed=3, tie_word_embeddings=tied)
  head = _torch_head(kind, seed=4)
  state = {k: v for k, v in lm.state_dict().items() if not (k == "lm_head.weight" and (tied or kind == "step"))}
  prefix = "score." if kind == "step" else "v_head."
  state.update({prefix + k: v for k, v in head.state_dict().items()})
  path.mkdir()
  safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
  d = lm.config.to_dict()
  d.update(architectures=[reward.ARCHITECTURES[kind]], num_labels=heads.Config(kind=kind).classes)
  (path / "config.json").write_text(json.dumps(d))
  return lm, head, state


def _torch_rewards(lm, head, kind, tokens):
  with torch.no_grad():
    h = lm.model(torch.as_tensor(tokens)).last_hidden_state
    if kind == "step":
      return torch.softmax(head(h), -1)[..., 1].numpy()
    return torch.sigmoid(head["summary"](h)[..., 0]).numpy()


@pytest.mark.parametrize("kind,tied", [("step", False), ("step", True), ("value", False), ("value", True)])
def test_reward_model_loads_with_torch_rewards_and_saves_the_same_tensors(hf_model, tmp_path, kind, tied):
  lm, head, state = _write_prm(hf_model, tmp_path / "prm", kind, tied)
  lm_cfg, lm_params, head_cfg, head_params = reward.load(str(tmp_path / "prm"))
  assert head_cfg.kind == kind and head_cfg.d_model == D
  tokens = np.random.default_rng(0).integers(0, 128, size=(2, 9))
  got = heads.position_rewards(head_params, head_cfg, heads.hidden_states(lm_params, lm_cfg, jnp.asarray(tokens)))
  np.testing.assert_allclose(np.asarray(got), _torch_rewards(lm, head, kind, tokens), rtol=1e-4, atol=1e-5)

  reward.save(str(tmp_path / "out"), lm_cfg, lm_params, head_cfg, head_params)
  back = io.read_dir(str(tmp_path / "out"))
  assert sorted(back) == sorted(state)
  for k, v in state.items():
    np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)
  assert reward.kind_of(io.read_config(str(tmp_path / "out"))) == kind
  with pytest.raises(FileExistsError):
    reward.save(str(tmp_path / "out"), lm_cfg, lm_params, head_cfg, head_params)


def test_plain_load_and_bad_checkpoints_name_what_they_expected(hf_model, tmp_path):
  _write_prm(hf_model, tmp_path / "prm", "step", tied=False)
  with pytest.raises(ValueError, match="reward model .*hf.reward.load"):
    hf.load(str(tmp_path / "prm"))
  lm = hf_model("qwen2", seed=1)
  lm.save_pretrained(str(tmp_path / "lm"))
  with pytest.raises(ValueError, match="expected a reward model with architectures"):
    reward.load(str(tmp_path / "lm"))
  t = io.read_dir(str(tmp_path / "prm"))
  t.pop("score.2.bias")
  io.write_dir(str(tmp_path / "prm"), t)
  with pytest.raises(ValueError, match="missing tensor score.2.bias"):
    reward.load(str(tmp_path / "prm"))
