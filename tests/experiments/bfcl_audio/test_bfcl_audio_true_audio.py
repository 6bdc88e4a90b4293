"""bfcl_audio's True-Audio suite on a tiny random Whisper and a tiny LM: the spliced forward equals the LM on
embeddings assembled by hand (pooled encoder output through the connector written in NumPy); greedy decoding
from the spliced prompt equals a full recompute per token; alignment training lowers the loss on the whole set
and moves only the connector; one step sharded over 8 devices equals one device; the suite's bookkeeping on a
scripted speech LLM; the saved connector round trip; one-line config errors."""
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import erf

from experiments import bfcl_audio as exp
from experiments.bfcl_audio import run as run_exp
from experiments._shared import recipes
from experiments.bfcl_audio import true_audio as ta
from jaxlab import losses, sharding
from jaxlab.generate import sample
from jaxlab.models import multimodal, vlm, whisper
from jaxlab.models import transformer as tfm
from jaxlab.train import state as state_lib

WCFG = whisper.PRESETS["tiny_random"]  # 16 encoder positions, 8 mel bins, 32 frames
LM = tfm.Config.tiny()
PID = 3
N, POOL = 4, 4


def _mcfg():
  return ta.model_config(LM, WCFG, exp.Config(audio_tokens=N, audio_pool=POOL), PID)


@pytest.fixture(scope="module")
def params():
  p = multimodal.init(_mcfg(), jax.random.PRNGKey(0))
  p["connector"] = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(1), x.shape), p["connector"])
  return p


def _tokens(rs, rows=2, t=12, start=2):
  toks = rs.randint(10, LM.vocab_size, (rows, t)).astype(np.int32)
  toks[:, start:start + N] = PID
  return toks


def _by_hand(p, toks, mel):
  """LM input embeddings: token rows of the embedding table, each row's placeholders replaced in order by the
  row's clip features: the encoder output's first N * POOL positions averaged in groups of POOL, then
  fc2(gelu(fc1(x))) in NumPy with the exact (erf) GELU."""
  enc = np.asarray(whisper.encode(p["encoder"], jnp.asarray(mel), WCFG), np.float64)
  pooled = enc[:, :N * POOL].reshape(len(mel), N, POOL, -1).mean(2)
  c = jax.tree.map(lambda x: np.asarray(x, np.float64), p["connector"])
  h = pooled @ c["fc1"]["kernel"] + c["fc1"]["bias"]
  h = 0.5 * h * (1 + erf(h / np.sqrt(2)))
  feats = h @ c["fc2"]["kernel"] + c["fc2"]["bias"]
  x = np.asarray(p["lm"]["embed"]["embedding"], np.float64)[toks]
  for b in range(len(toks)):
    x[b, toks[b] == PID] = feats[b]
  return x.astype(np.float32), pooled.astype(np.float32)


@jax.jit
def _lm(lm_params, x_BTD, mask_BT):
  return tfm.forward(lm_params, mask_BT, LM, inputs_embeds_BTD=x_BTD, attention_mask_BT=mask_BT).logits


def test_spliced_forward_equals_the_lm_on_hand_assembled_embeddings(params):
  rs = np.random.RandomState(0)
  toks, mel = _tokens(rs), rs.randn(2, WCFG.n_mels, WCFG.n_frames).astype(np.float32)
  x, pooled = _by_hand(params, toks, mel)
  want = np.asarray(_lm(params["lm"], jnp.asarray(x), jnp.ones(toks.shape, jnp.int32)))
  mcfg = _mcfg()
  fwd = jax.jit(multimodal.forward, static_argnums=3)
  got = fwd(params, toks, jnp.asarray(mel), mcfg).logits
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-4)
  pre = fwd(params, toks, None, mcfg, features_BNE=jnp.asarray(pooled)).logits
  np.testing.assert_allclose(np.asarray(pre), want, atol=2e-4)
  emb = multimodal.embed({k: params[k] for k in ("lm", "connector")}, toks, None, mcfg, features_BNE=pooled)
  np.testing.assert_allclose(np.asarray(emb), x, atol=1e-5)
  with pytest.raises(ValueError, match="need 12 audio clip tokens"):
    multimodal.embed(params, toks, None, mcfg, features_BNE=np.concatenate([pooled, pooled[:1]]))


def test_greedy_decoding_from_spliced_embeddings_equals_full_recompute(params):
  rs = np.random.RandomState(1)
  toks, mel = _tokens(rs, t=10, start=3), rs.randn(2, WCFG.n_mels, WCFG.n_frames).astype(np.float32)
  mask = np.ones_like(toks)
  toks[1, :2], mask[1, :2] = 0, 0  # row 1 left-padded
  x, _ = _by_hand(params, toks, mel)
  out = sample(params["lm"], LM, toks, 3, prompt_mask=mask, inputs_embeds_BTD=jnp.asarray(x))
  table = np.asarray(params["lm"]["embed"]["embedding"])
  seq, m = x, mask
  for i in range(3):
    logits = _lm(params["lm"], jnp.asarray(seq), jnp.asarray(m))
    nxt = np.asarray(jnp.argmax(logits[:, -1], -1))
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, i], nxt)
    seq = np.concatenate([seq, table[nxt][:, None]], 1)
    m = np.concatenate([m, np.ones((2, 1), m.dtype)], 1)
  with pytest.raises(ValueError, match="inputs_embeds_BTD must be"):
    sample(params["lm"], LM, toks, 2, prompt_mask=mask, inputs_embeds_BTD=jnp.asarray(x[:, 1:]))


def _align_data(rs, n=8, t=14):
  toks = _tokens(rs, rows=n, t=t + 1, start=1)
  mask = np.zeros((n, t), np.int32)
  mask[:, N + 1:] = 1
  feats = rs.randn(n, N, WCFG.d_model).astype(np.float32)
  # targets that depend on the audio: the first answer token is chosen by the sign of the features' mean
  toks[:, N + 2] = np.where(feats.mean((1, 2)) > 0, 20, 21)
  return {"inputs": toks[:, :-1], "targets": toks[:, 1:], "loss_mask": mask, "features": feats}


def test_connector_training_lowers_the_loss_and_moves_only_the_connector(params, tmp_path):
  mcfg = _mcfg()
  data = _align_data(np.random.RandomState(2))
  loss_fn = losses.multimodal_loss_fn(mcfg, freeze=True)

  def mean_loss(connector):
    s, w, _ = loss_fn({"connector": connector, "lm": params["lm"]}, jax.tree.map(jnp.asarray, data), None)
    return float(s / w)

  before = mean_loss(params["connector"])
  conn, hist = ta.train_connector(mcfg, params["lm"], params["connector"], data, steps=30, batch=4, lr=3e-2,
                                  seed=0, metrics_path=str(tmp_path / "m.jsonl"))
  assert mean_loss(conn) < before - 0.1, (before, mean_loss(conn), hist)
  assert len(hist) >= 2 and np.isfinite(hist).all()
  assert float(jnp.abs(params["lm"]["embed"]["embedding"]).sum()) > 0  # the caller's LM was not donated away
  assert not np.allclose(np.asarray(conn["fc1"]["kernel"]), np.asarray(params["connector"]["fc1"]["kernel"]))
  meta = {"audio_tokens": N, "seed": 0}
  ta.save_connector(str(tmp_path / "art"), conn, {"settings": meta, "history": hist, "clips": 8})
  back, record = ta.load_connector(str(tmp_path / "art"), meta)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), back, conn)
  assert record["history"] == hist
  assert ta.load_connector(str(tmp_path / "art"), dict(meta, seed=1)) is None  # other settings: retrain


def test_connector_step_sharded_equals_single_device(params):
  mcfg = _mcfg()
  data = _align_data(np.random.RandomState(3))
  loss_fn = losses.multimodal_loss_fn(mcfg, freeze=True)
  tx = vlm.connector_only(optax.sgd(0.5))
  p = {"connector": params["connector"], "lm": params["lm"]}
  mm_axes = multimodal.AXES  # the LM's and the connector's

  def one_step(mesh):
    pp = jax.tree.map(jnp.copy, p) if mesh is None else sharding.shard_params(p, mesh, "fsdp_tp", axes=mm_axes)
    state = state_lib.state_from_params(pp, tx, mesh=mesh, rules="fsdp_tp", axes=mm_axes)
    step = recipes.train_step(loss_fn, tx, state, mesh, "fsdp_tp", axes=mm_axes)
    batch = data if mesh is None else sharding.shard_batch(data, mesh)
    new, m = step(state, jax.tree.map(jnp.asarray, batch) if mesh is None else batch)
    return jax.tree.map(np.asarray, new.params), float(m["loss"])

  single, loss1 = one_step(None)
  multi, loss8 = one_step(sharding.make_mesh("data:2,fsdp:2,tensor:2"))
  assert loss8 == pytest.approx(loss1, rel=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, atol=1e-5), single["connector"], multi["connector"])
  assert not np.allclose(single["connector"]["fc2"]["kernel"], np.asarray(p["connector"]["fc2"]["kernel"]))
  np.testing.assert_array_equal(multi["lm"]["embed"]["embedding"], np.asarray(p["lm"]["embed"]["embedding"]))


class ScriptedSpeechLLM:
  """Answers each spoken request with its ground-truth calls except `wrong` (one argument changed) and repeats
  each clip's request with its last word dropped; records what it was given."""

  def __init__(self, items, wrong):
    self.by_id, self.wrong, self.cut, self.seen = {it["id"]: it for it in items}, wrong, 0, []
    self.record = {"history": [4.0, 3.0, 2.5, 2.0, 1.0], "clips": 7}

  def answer(self, requests, clips):
    assert len(requests) == len(clips) and all(c.ndim == 1 and c.size > 1600 for c in clips)
    self.seen += [r["id"] for r in requests]
    self.cut = 1
    out = []
    for r in requests:
      it = self.by_id[r["id"]]
      if it["ground_truth"] is None:
        out.append("No function fits.")
      else:
        calls = []
        for c in it["ground_truth"]:
          name, args = next(iter(c.items()))
          kw = {p: next(o for o in opts if o != "") for p, opts in args.items() if any(o != "" for o in opts)}
          if r["id"] == self.wrong:
            kw = {p: v + 1 if type(v) is int else v for p, v in kw.items()}
          calls.append(f"{name}({', '.join(f'{p}={v!r}' for p, v in kw.items())})")
        out.append("[" + ", ".join(calls) + "]")
    return out

  def repeat(self, clips, max_new_tokens):
    return [" ".join(it["text"].split()[:-1]) for it in self.by_id.values()][:len(clips)]


def test_true_audio_bookkeeping_on_a_scripted_speech_llm(tmp_path):
  if shutil.which("espeak-ng") is None:
    pytest.skip("espeak-ng is not installed")
  cfg = exp.Config(suites=("true_audio",), categories=("simple", "irrelevance"), n_per_category=2)
  items = run_exp.load_items(cfg.categories, cfg.n_per_category)
  llm = ScriptedSpeechLLM(items, wrong="simple_python_1")
  res = run_exp.run_with(cfg, str(tmp_path), None, None, llm)
  assert llm.seen == [it["id"] for it in items]
  assert res["ast_accuracy.true_audio.simple"] == 0.5 and res["irrelevance.true_audio"] == 1.0
  assert res["failures.true_audio.wrong_value"] == 1 and res["ast_accuracy.true_audio.overall"] == 0.5
  errs = [run_exp.word_errors(it["text"], " ".join(it["text"].split()[:-1])) for it in items]
  assert res["wer.true_audio"] == pytest.approx(sum(e for e, _ in errs) / sum(n for _, n in errs))
  assert res["true_audio.cut"] == 0.25 and res["connector.clips"] == 7
  assert res["connector.loss_first"] == 4.0 and res["connector.loss_last"] == 1.0
  rows = [json.loads(x) for x in (tmp_path / "true_audio.jsonl").read_text().splitlines()]
  assert [r["valid"] for r in rows] == [True, False, True, True] and rows[0]["repeated"] == \
      " ".join(items[0]["text"].split()[:-1])
  with pytest.raises(ValueError, match="needs a speech LLM"):
    run_exp.run_with(cfg, str(tmp_path), None, None, None)


def test_align_batch_puts_the_loss_on_the_answer_only():
  class Tok:
    batch_pad_id = 0

    def encode(self, text):
      return [ord(ch) for ch in text]

  prompt = [1, PID, PID, 2]
  d = ta.align_batch(prompt, ["abc", "abcdefgh"], Tok(), 9, max_tokens=5)
  np.testing.assert_array_equal(d["inputs"][0], [1, PID, PID, 2, 97, 98, 99, 9, 0, 0])
  np.testing.assert_array_equal(d["targets"][1], [PID, PID, 2, 97, 98, 99, 100, 101, 9, 0])
  np.testing.assert_array_equal(d["loss_mask"][0], [0, 0, 0, 1, 1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(d["loss_mask"][1], [0, 0, 0, 1, 1, 1, 1, 1, 1, 0])


@pytest.mark.parametrize("kw,match", [
    (dict(audio_tokens=100, audio_pool=16), "audio_tokens \\* audio_pool must be <= 1500"),
    (dict(align_steps=-1), "align_steps must be >= 0, found -1"),
    (dict(align_lr=0.0), "align_lr must be positive"),
    (dict(suites=("ture_audio",)), "suites must be one of .* found 'ture_audio'"),
])
def test_bad_true_audio_config_is_a_one_line_error(kw, match):
  with pytest.raises(ValueError, match=match) as e:
    exp.Config(**kw)
  assert "\n" not in str(e.value)


def test_audio_token_must_be_one_token():
  class Tok:
    def encode(self, text):
      return [5] if text == "<file_sep>" else [7, 8]

  assert ta.audio_token_id(Tok(), "<file_sep>") == 5
  with pytest.raises(ValueError, match="audio_token must be a single token .* 'hello world' -> 2 tokens") as e:
    ta.audio_token_id(Tok(), "hello world")
  assert "\n" not in str(e.value)
