"""jaxlab.models.mdm: the masked-diffusion loss against NumPy, the noising process, Dream's shift, configs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.models import mdm
from jaxlab.models import transformer as tfm


def _np_loss(logits, tokens, masked, p, prompt_len=None):
  """LLaDA GUIDELINES.md, written out: CE on masked tokens / p, over B*L (pretraining) or answer length (SFT)."""
  b, l, _ = logits.shape
  total = 0.0
  for i in range(b):
    row = 0.0
    for j in range(l):
      if masked[i, j]:
        z = logits[i, j] - logits[i, j].max()
        row += -(z[tokens[i, j]] - np.log(np.exp(z).sum())) / p[i]
    total += row if prompt_len is None else row / (l - prompt_len[i])
  return total / (b * l) if prompt_len is None else total / b


def test_masked_ce_hand_computed_case():
  # Two rows of three tokens over a 3-token vocabulary; row 0 masks positions 0 and 2 at p=0.5, row 1
  # masks position 1 at p=0.25. With uniform logits every CE is log 3.
  logits = np.zeros((2, 3, 3), np.float32)
  tokens = np.array([[0, 1, 2], [2, 2, 1]])
  masked = np.array([[True, False, True], [False, True, False]])
  p = np.array([0.5, 0.25], np.float32)
  got, n = mdm.masked_ce(jnp.asarray(logits), jnp.asarray(tokens), jnp.asarray(masked), jnp.asarray(p))
  assert int(n) == 3
  np.testing.assert_allclose(float(got), np.log(3) * (2 / 0.5 + 1 / 0.25) / 6, rtol=1e-6)
  # SFT with prompt lengths 1 and 2: answer lengths 2 and 1.
  got, _ = mdm.masked_ce(jnp.asarray(logits), jnp.asarray(tokens), jnp.asarray(masked), jnp.asarray(p),
                         prompt_len_B=jnp.array([1, 2]))
  np.testing.assert_allclose(float(got), np.log(3) * ((2 / 0.5) / 2 + (1 / 0.25) / 1) / 2, rtol=1e-6)


@pytest.mark.parametrize("sft", [False, True])
def test_loss_equals_numpy_on_random_case(sft):
  cfg = mdm.Config.tiny()
  params = mdm.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (3, 10), 0, 60)
  plen = jnp.array([2, 5, 0]) if sft else None
  key = jax.random.key(7)
  got, aux = mdm.loss(params, tokens, cfg, key, prompt_len_B=plen)
  noisy, masked, p = mdm.forward_process(key, tokens, cfg.mask_token_id, prompt_len_B=plen)
  logits = np.asarray(mdm.forward(params, noisy, cfg).logits, np.float64)
  want = _np_loss(logits, np.asarray(tokens), np.asarray(masked), np.asarray(p, np.float64),
                  None if plen is None else np.asarray(plen))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  assert int(aux["masked_tokens"]) == int(np.asarray(masked).sum()) > 0


def test_forward_process_statistics_and_prompt():
  tokens = jnp.zeros((4000, 16), jnp.int32)
  plen = jnp.full((4000,), 5)
  noisy, masked, p = mdm.forward_process(jax.random.key(0), tokens, 9, prompt_len_B=plen, eps=1e-3)
  masked, p = np.asarray(masked), np.asarray(p)
  assert not masked[:, :5].any() and ((np.asarray(noisy) == 9) == masked).all()
  assert p.min() >= 1e-3 and p.max() < 1.0
  assert abs(p.mean() - 0.5) < 0.02  # t ~ U[0, 1)
  np.testing.assert_allclose(masked[:, 5:].mean(1).mean(), p.mean(), atol=0.01)
  # the per-row rate follows that row's p
  assert np.corrcoef(masked[:, 5:].mean(1), p)[0, 1] > 0.9


def test_forward_is_bidirectional_and_dream_shift():
  cfg = mdm.Config.tiny()
  params = mdm.init(cfg, jax.random.key(0))
  x = jax.random.randint(jax.random.key(2), (2, 8), 0, 60)
  a = np.asarray(mdm.forward(params, x, cfg).logits)
  b = np.asarray(mdm.forward(params, x.at[:, -1].set(cfg.mask_token_id), cfg).logits)
  assert np.abs(a[:, 0] - b[:, 0]).max() > 1e-6  # the first position sees the last one
  raw = np.asarray(tfm.forward(params, x, cfg).logits)
  np.testing.assert_array_equal(a, raw)
  shifted = np.asarray(mdm.forward(params, x, cfg.replace(shift_logits=True)).logits)
  np.testing.assert_array_equal(shifted[:, 1:], raw[:, :-1])
  np.testing.assert_array_equal(shifted[:, 0], raw[:, 0])


def test_config_validation_and_presets():
  with pytest.raises(ValueError, match="bidirectional"):
    mdm.Config.tiny(causal=True)
  with pytest.raises(ValueError, match="mask_token_id"):
    mdm.Config.tiny(mask_token_id=64)
  with pytest.raises(TypeError, match="hf_format"):  # the checkpoint layout is jaxlab.hf.llada's, not a field
    mdm.Config.tiny(hf_format="gpt")
  c = mdm.PRESETS["llada-8b"]
  assert (c.mask_token_id, c.vocab_size, c.d_ff, c.rope.theta, c.causal) == (126336, 126464, 12288, 5e5, False)
  n = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(jax.eval_shape(lambda: mdm.init(c, jax.random.key(0)))))
  assert 7.9e9 < n < 8.1e9  # LLaDA-8B
  assert mdm.PRESETS["dream-7b"].shift_logits and mdm.PRESETS["dream-7b"].qkv_bias
  t = c.transformer()
  assert type(t) is tfm.Config and not t.causal and t.d_model == 4096
  assert mdm.Config.from_transformer(t, mask_token_id=5).mask_token_id == 5


def test_pack_sft_pads_answers_with_eos():
  toks, plen = mdm.pack_sft([[1, 2], [3]], [[4], [5, 6, 7]], 6, eos_id=9)
  np.testing.assert_array_equal(toks, [[1, 2, 4, 9, 9, 9], [3, 5, 6, 7, 9, 9]])
  np.testing.assert_array_equal(plen, [2, 1])
  with pytest.raises(ValueError, match="exceed length"):
    mdm.pack_sft([[1, 2, 3]], [[4, 5, 6, 7]], 6, eos_id=9)
