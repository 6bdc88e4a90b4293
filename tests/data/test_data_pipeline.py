"""LM pipeline: packing against a brute-force token stream, determinism, sharding, splits and exact resume."""
import json

import numpy as np
import pytest

from jaxlab.data import ByteTokenizer, LMData, from_texts, lm_batches, stdlib_corpus
from jaxlab.data.pipeline import KEYS

TOK = ByteTokenizer()
DOCS = [f"doc{i:03d}:" + "xyz"[i % 3] * (i * 7 % 23) for i in range(60)]


def _rows(it, n=None):
  """All rows (dicts of [T] arrays) of the first n batches (all if None), in order."""
  rows = []
  for k, b in enumerate(it):
    if n is not None and k == n:
      break
    assert set(b) == set(KEYS) and all(v.dtype == np.int32 and v.ndim == 2 for v in b.values())
    rows += [{key: b[key][r] for key in KEYS} for r in range(b["inputs"].shape[0])]
  return rows


def _stream_of(rows):
  """The token stream the windows were cut from: every real input, then the final target."""
  rows = [r for r in rows if r["loss_mask"].any()]
  toks = [r["inputs"][r["loss_mask"] == 1] for r in rows]
  last = rows[-1]["targets"][rows[-1]["loss_mask"] == 1][-1:]
  return np.concatenate(toks + [last]).tolist()


def _docs_of(stream):
  return TOK.decode(stream, skip_special=False).split("<eos>")[:-1]


def _ordered(seq_len=16, batch_size=3, **kw):
  return LMData(seq_len, batch_size, num_epochs=1, shuffle=False, drop_remainder=False, **kw)


@pytest.mark.parametrize("seq_len,add_bos", [(16, False), (7, True), (300, False)])
def test_packing_brute_force(seq_len, add_bos):
  rows = _rows(_ordered(seq_len, 4, add_bos=add_bos).iterator(from_texts(DOCS), TOK, 0, 1))
  stream, doc_of = [], []
  for d, text in enumerate(DOCS):
    ids = TOK.encode(text, add_bos=add_bos, add_eos=True)
    stream += ids
    doc_of += [d] * len(ids)
  assert len(rows) == -(-(len(stream) - 1) // seq_len)
  assert _stream_of(rows) == stream
  for i, r in enumerate(rows):
    lo = i * seq_len
    n = min(seq_len, len(stream) - 1 - lo)
    np.testing.assert_array_equal(r["inputs"][:n], stream[lo:lo + n])
    np.testing.assert_array_equal(r["targets"][:n], stream[lo + 1:lo + n + 1])
    np.testing.assert_array_equal(r["inputs"][1:n], r["targets"][:n - 1])
    assert r["loss_mask"].tolist() == [1] * n + [0] * (seq_len - n)
    assert (r["targets"][n:] == TOK.pad_id).all() and (r["segment_ids"][n:] == 0).all()
    docs_here = doc_of[lo:lo + n]
    firsts = {d: docs_here.index(d) for d in docs_here}
    want_seg = [sorted(firsts).index(d) + 1 for d in docs_here]
    want_pos = [t - firsts[d] for t, d in enumerate(docs_here)]
    assert r["segment_ids"][:n].tolist() == want_seg and r["positions"][:n].tolist() == want_pos
  if rows[-1]["loss_mask"].sum() < seq_len and len(rows) % 4:  # tail of the last batch is all padding
    it = _ordered(seq_len, 4, add_bos=add_bos).iterator(from_texts(DOCS), TOK, 0, 1)
    assert list(it)[-1]["loss_mask"][len(rows) % 4:].sum() == 0


def test_drop_remainder_keeps_only_full_windows_and_batches():
  stream_len = sum(len(d.encode()) + 1 for d in DOCS)
  cfg = LMData(16, 3, num_epochs=1, shuffle=False)
  batches = list(cfg.iterator(from_texts(DOCS), TOK, 0, 1))
  assert len(batches) == ((stream_len - 1) // 16) // 3
  assert all(b["loss_mask"].all() for b in batches)


def test_same_seed_same_batches_different_seed_different_order():
  def first(seed, n=6):
    return [b["inputs"] for b in _rows_batches(LMData(16, 4, seed=seed, shuffle_buffer=8), n)]
  a, b, c = first(1), first(1), first(2)
  assert all((x == y).all() for x, y in zip(a, b))
  assert not all((x == y).all() for x, y in zip(a, c))


def test_batches_do_not_depend_on_reader_threads():
  a, b = (_rows_batches(LMData(16, 4, seed=3, shuffle_buffer=8, read_threads=t), 12) for t in (0, 4))
  assert all((x[k] == y[k]).all() for x, y in zip(a, b) for k in KEYS)


def _rows_batches(cfg, n, docs=DOCS, pi=0, pc=1):
  it = cfg.iterator(from_texts(docs), TOK, pi, pc)
  return [next(it) for _ in range(n)]


def test_epochs_reshuffle_documents():
  letters = [chr(ord("a") + i) for i in range(26)]
  cfg = LMData(5, 2, seed=3, num_epochs=3, shuffle_buffer=1, drop_remainder=False)
  rows = _rows(cfg.iterator(from_texts(letters), TOK, 0, 1))
  order = _docs_of(_stream_of(rows))
  epochs = [order[k * 26:(k + 1) * 26] for k in range(3)]
  assert len(order) == 78 and all(sorted(e) == letters for e in epochs)
  assert len({tuple(e) for e in epochs}) == 3 and epochs[0] != letters


def test_window_shuffle_permutes_within_windows():
  docs, buf = from_texts(DOCS), 16
  base = _rows(LMData(8, 1, seed=5, num_epochs=1, shuffle_buffer=1, drop_remainder=False).iterator(docs, TOK, 0, 1))
  mixed = _rows(LMData(8, 1, seed=5, num_epochs=1, shuffle_buffer=buf, drop_remainder=False).iterator(docs, TOK, 0, 1))
  key = lambda r: tuple(np.concatenate([r[k] for k in KEYS]).tolist())
  assert len(base) == len(mixed) > 2 * buf
  for w in range(0, len(base), buf):  # same rows inside every buffer window, in another order
    assert sorted(map(key, base[w:w + buf])) == sorted(map(key, mixed[w:w + buf]))
  assert [key(r) for r in mixed] != [key(r) for r in base]


@pytest.mark.parametrize("count", [1, 3, 4])
def test_process_shards_disjoint_and_cover(count):
  seen = []
  for p in range(count):
    cfg = LMData(8, 2, seed=7, num_epochs=1, shuffle_buffer=1, drop_remainder=False)
    seen.append(_docs_of(_stream_of(_rows(cfg.iterator(from_texts(DOCS), TOK, p, count)))))
  flat = [d for s in seen for d in s]
  assert sorted(flat) == sorted(DOCS) and len(flat) == len(set(flat))
  with pytest.raises(ValueError, match="process_index"):
    LMData(8, 2).dataset(from_texts(DOCS), TOK, count, count)


def test_default_process_is_jax_process():
  a = _rows_batches(LMData(8, 2, seed=1), 3, pi=None, pc=None)
  b = _rows_batches(LMData(8, 2, seed=1), 3, pi=0, pc=1)
  assert all((x["inputs"] == y["inputs"]).all() for x, y in zip(a, b))


def test_train_val_split_disjoint_by_hash():
  val = _docs_of(_stream_of(_rows(lm_batches(DOCS, "byte", 16, 2, split="val", val_fraction=0.3,
                                             process_index=0, process_count=1))))
  train = _docs_of(_stream_of(_rows(lm_batches(DOCS, "byte", 16, 2, split="train", val_fraction=0.3, num_epochs=1,
                                               shuffle_buffer=1, drop_remainder=False, process_index=0,
                                               process_count=1))))
  assert val == [d for d in DOCS if d in set(val)]  # val is one ordered pass
  assert set(val).isdisjoint(train) and sorted(val + train) == sorted(DOCS) and 5 < len(val) < 35
  with pytest.raises(ValueError, match="no documents"):
    lm_batches(DOCS, "byte", 16, 2, split="val", val_fraction=0.0)


@pytest.mark.parametrize("cfg", [
    LMData(16, 3, seed=11, shuffle_buffer=5, read_threads=2),  # infinite epochs, window shuffle, threads
    LMData(16, 4, seed=4, num_epochs=2, shuffle_buffer=1, drop_remainder=False, read_threads=0),
], ids=["repeat-shuffle", "finite-padded"])
def test_restore_mid_epoch_yields_exactly_the_remaining_batches(cfg):
  docs = from_texts(DOCS)
  ref = list(_take(cfg.iterator(docs, TOK, 0, 1), 40))
  epoch_batches = sum(len(d) + 1 for d in DOCS) // (cfg.seq_len * cfg.batch_size)
  assert 10 < epoch_batches < 30  # the checks below cross an epoch boundary
  for k in (0, 1, 7, 19, 23, min(35, len(ref) - 1)):
    it = cfg.iterator(docs, TOK, 0, 1)
    for _ in range(k):
      next(it)
    state = json.loads(json.dumps(it.get_state()))
    fresh = cfg.iterator(docs, TOK, 0, 1)
    fresh.set_state(state)
    rest = list(_take(fresh, 40 - k))
    assert len(rest) == len(ref) - k
    for x, y in zip(rest, ref[k:]):
      assert all((x[key] == y[key]).all() for key in KEYS)
    list(_take(it, 2))
    it.set_state(state)  # rewinding the same iterator works too
    assert (next(it)["inputs"] == ref[k]["inputs"]).all()


def _take(it, n):
  for _ in range(n):
    try:
      yield next(it)
    except StopIteration:
      return


def test_stdlib_batches_decode_to_source_text():
  docs = stdlib_corpus(max_docs=12)
  it = lm_batches(docs, "byte", 64, 4, seed=0, split=None, process_index=0, process_count=1)
  source = "\x00".join(docs)
  for _ in range(5):
    b = next(it)
    for r in range(4):
      for piece in TOK.decode(b["inputs"][r], skip_special=False).split("<eos>"):
        assert "\ufffd" in piece or piece in source


def test_packing_with_hf_tokenizer_file(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers
  words = sorted({w for d in DOCS for w in d.replace(":", " ").split()})
  tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", "</s>"] + words)}, unk_token="[UNK]"))
  tk.pre_tokenizer = pre_tokenizers.Whitespace()
  tk.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
  rows = _rows(lm_batches(DOCS, str(tmp_path), 5, 2, split=None, num_epochs=1, shuffle=False,
                          drop_remainder=False, process_index=0, process_count=1))
  want = [i for d in DOCS for i in tk.encode(d, add_special_tokens=False).ids + [1]]
  assert _stream_of(rows) == want


def test_tokenizer_without_eos_is_refused_before_reading(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers
  tk = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
  tk.pre_tokenizer = pre_tokenizers.Whitespace()
  tk.save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(ValueError, match="has no eos token, which separates packed documents"):
    lm_batches(DOCS, str(tmp_path), 5, 2, split=None, process_index=0, process_count=1)
  rows = _rows(lm_batches(["a a a a a a"], str(tmp_path), 3, 1, split=None, num_epochs=1, shuffle=False,
                          add_eos=False, process_index=0, process_count=1))
  assert set(_stream_of(rows)) == {1}  # add_eos=False packs the bare token stream
