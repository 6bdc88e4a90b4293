"""LogitLens/EmbeddingLens against tfm.forward and brute force; LatentLens index sampling, contents, save/load."""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.interp import lenses
from jaxlab.models import transformer as tfm


@pytest.fixture(scope="module")
def lm():
  cfg = tfm.Config.tiny(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2)
  params = tfm.init(cfg, jax.random.key(0))
  return cfg, params


def _rms(x, scale, eps):
  return scale * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


@pytest.mark.parametrize("tied", [False, True])
def test_logit_lens_matches_forward(tied):
  cfg = tfm.Config.tiny(vocab_size=64, d_model=32, n_heads=4, d_ff=64, tie_embeddings=tied)
  params = tfm.init(cfg, jax.random.key(1))
  params["final_norm"]["scale"] = 1 + 0.3 * jax.random.normal(jax.random.key(2), (32,))
  tok = jax.random.randint(jax.random.key(3), (2, 9), 0, 64)
  out = tfm.forward(params, tok, cfg, capture=("hidden_states",))
  lens = lenses.LogitLens.from_tfm(params, cfg)
  s, ids = lens.over_layers(out.hidden_states, k=4)
  # hidden_states[-1] is already final-normed (HF convention): the lens must not norm it again.
  ref_s, ref_i = jax.lax.top_k(out.logits, 4)
  np.testing.assert_array_equal(ids[-1], ref_i)
  np.testing.assert_array_equal(ids[-1, ..., 0], jnp.argmax(out.logits, -1))
  np.testing.assert_allclose(s[-1], ref_s, rtol=1e-5, atol=1e-5)
  head = np.asarray(params["embed"]["embedding"]).T if tied else np.asarray(params["lm_head"]["kernel"])
  h1 = np.asarray(out.hidden_states[1], np.float64)
  ref = _rms(h1, np.asarray(params["final_norm"]["scale"], np.float64), cfg.norm_eps) @ head
  np.testing.assert_array_equal(ids[1], np.argsort(-ref, axis=-1, kind="stable")[..., :4])
  np.testing.assert_allclose(s[1], np.sort(ref, -1)[..., ::-1][..., :4], rtol=1e-5, atol=1e-5)


def test_embedding_lens_brute_force(lm):
  cfg, params = lm
  rng = np.random.default_rng(0)
  table = np.array(params["embed"]["embedding"])
  table[7] = table[3] * 2.0  # an exact tie in cosine: the lower id must come first
  h = rng.standard_normal((5, cfg.d_model)).astype(np.float32)
  h[0] = table[3]
  s, ids = lenses.EmbeddingLens(table).topk(h, k=6)
  cos = (h / np.linalg.norm(h, axis=-1, keepdims=True)) @ (table / np.linalg.norm(table, axis=-1, keepdims=True)).T
  np.testing.assert_array_equal(ids, np.argsort(-cos, axis=-1, kind="stable")[:, :6])
  np.testing.assert_allclose(s, np.sort(cos, -1)[:, ::-1][:, :6], atol=1e-5)
  assert list(ids[0, :2]) == [3, 7]


def test_reservoir_cap_skip_and_determinism():
  rng = np.random.default_rng(0)
  corpus = [list(rng.integers(0, 6, rng.integers(1, 12))) for _ in range(80)]
  key = lambda t: "even" if t % 2 == 0 else str(t)  # several ids share one string
  e = lenses.select_entries(corpus, max_contexts=7, skip_first=2, seed=3, dedupe=False, key=key)
  occ = collections.Counter(key(int(corpus[c][p])) for c, seq in enumerate(corpus) for p in range(2, len(seq))
                            for _ in [c])
  got = collections.Counter(key(int(corpus[c][p])) for c, p in e)
  assert got == {k: min(7, n) for k, n in occ.items()}
  assert (e[:, 1] >= 2).all() and len(np.unique(e, axis=0)) == len(e)
  assert np.array_equal(e, lenses.select_entries(corpus, max_contexts=7, skip_first=2, seed=3, dedupe=False,
                                                 key=key))
  assert not np.array_equal(e, lenses.select_entries(corpus, max_contexts=7, skip_first=2, seed=4, dedupe=False,
                                                     key=key))
  all_pos = lenses.select_entries(corpus, max_contexts=10**6, skip_first=3, dedupe=False)
  assert sorted(map(tuple, all_pos)) == [(c, p) for c, s in enumerate(corpus) for p in range(3, len(s))]


def test_reservoir_is_uniform():
  # One token string occurring n times: each occurrence must be kept with probability cap / n.
  n, cap, trials = 40, 5, 400
  corpus = [[9, 9, 1] for _ in range(n)]
  hits = np.zeros(n)
  for seed in range(trials):
    e = lenses.select_entries(corpus, max_contexts=cap, skip_first=2, seed=seed, dedupe=False)
    assert len(e) == cap
    hits[e[:, 0]] += 1
  p = cap / n
  sd = np.sqrt(trials * p * (1 - p))
  assert np.abs(hits - trials * p).max() < 4.5 * sd, hits
  assert hits[:cap].mean() < trials * p + 3 * sd / np.sqrt(cap)  # the first occurrences are not favoured


def test_dedupe_skips_repeated_prefixes():
  corpus = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4, 6]]
  e = lenses.select_entries(corpus, max_contexts=5, skip_first=1)
  assert [tuple(x) for x in e] == [(0, 1), (0, 2), (0, 3), (1, 3), (2, 4)]


@pytest.fixture(scope="module")
def corpus_states(lm):
  """A corpus and, as the oracle, every context's hidden states from its own unpadded tfm.forward."""
  cfg, params = lm
  rng = np.random.default_rng(1)
  corpus = [list(rng.integers(0, cfg.vocab_size, rng.choice([3, 9, 19]))) for _ in range(11)]
  fwd = jax.jit(lambda t: tfm.forward(params, t, cfg, capture=("hidden_states",)).hidden_states)
  states = [np.asarray(fwd(jnp.asarray([c])))[:, 0] for c in corpus]
  return corpus, states, lenses.tfm_hidden_fn(params, cfg)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3fn"])
def test_build_index_contents_and_round_trip(lm, corpus_states, dtype, tmp_path):
  cfg, params = lm
  corpus, states, hidden_fn = corpus_states
  idx = lenses.build_index(hidden_fn, corpus, [2, 0, 1], max_contexts=3, skip_first=2, dtype=dtype,
                           decode=lambda t: f"<{t}>", batch_size=4)
  assert idx.layers == (0, 1, 2) and idx.vectors.dtype == lenses.DTYPES[dtype]
  entries = lenses.select_entries(corpus, max_contexts=3, skip_first=2, key=lambda t: f"<{t}>")
  np.testing.assert_array_equal(np.stack([idx.context, idx.position], 1), entries)
  want = np.stack([states[c][:, p] for c, p in entries], axis=1)
  np.testing.assert_array_equal(idx.token_id, [corpus[c][p] for c, p in entries])
  want /= np.linalg.norm(want, axis=-1, keepdims=True)
  got = idx.dequantized()
  np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5 if dtype == "float32" else 1e-2)
  tol = {"float32": 1e-5, "bfloat16": 1e-2, "float8_e4m3fn": 0.08}[dtype]
  np.testing.assert_allclose(got, want, atol=tol)
  cos = np.sum(got * want, -1) / np.linalg.norm(got, axis=-1)
  assert (cos > {"float32": 0.99999, "bfloat16": 0.9995, "float8_e4m3fn": 0.99}[dtype]).all(), cos.min()
  assert idx.token_strings[int(idx.token_id[0])] == f"<{idx.token_id[0]}>"

  idx.save(str(tmp_path))
  back = lenses.LatentIndex.load(str(tmp_path))
  assert back.layers == idx.layers and back.token_strings == idx.token_strings and back.meta == idx.meta
  np.testing.assert_array_equal(back.vectors.view(np.uint8), idx.vectors.view(np.uint8))
  for name in ("scale", "token_id", "position", "context"):
    a, b = getattr(idx, name), getattr(back, name)
    assert (a is None) == (b is None) and (a is None or np.array_equal(a, b)), name

  # A stored state finds itself first, at the stored layer, from its own context.
  q = want[1, 4] + 0.0
  for index in (idx, back):
    nb = lenses.LatentLens(index, chunk=8).search(q[None], k=3)
    assert nb.row[0, 0] == 4 and nb.layer[0, 0] == 1 and nb.context[0, 0] == idx.context[4]
    assert float(nb.score[0, 0]) > 0.99
  desc = lenses.LatentLens(back).describe(nb)
  assert desc[0][0]["token"] == f"<{idx.token_id[4]}>" and desc[0][0]["position"] == idx.position[4]


def test_load_rejects_mismatched_files(lm, tmp_path):
  rng = np.random.default_rng(0)
  idx = lenses.LatentIndex((0,), lenses.quantize(rng.standard_normal((4, 8)), "float32")[0][None], None,
                           np.zeros(4, np.int32), np.zeros(4, np.int32), np.zeros(4, np.int32), {})
  idx.save(str(tmp_path))
  import json
  info = json.load(open(tmp_path / "index.json"))
  info["dtype"] = "bfloat16"
  json.dump(info, open(tmp_path / "index.json", "w"))
  with pytest.raises(ValueError, match="index.json says"):
    lenses.LatentIndex.load(str(tmp_path))
  with pytest.raises(FileNotFoundError):
    lenses.LatentIndex.load(str(tmp_path / "nope"))
