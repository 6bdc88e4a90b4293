"""Corpora: stdlib listing against an independent walk, file formats round trip, hash splits."""
import json
import os
import subprocess
import sys
import sysconfig

import pytest

from jaxlab.data import (Corpus, from_texts, hf_corpus, jsonl_corpus, parquet_corpus, split_by_hash, stdlib_corpus,
                         text_corpus)


def test_stdlib_corpus_matches_independent_walk():
  root = sysconfig.get_paths()["stdlib"]
  want = []
  for dirpath, _dirnames, filenames in os.walk(root):
    parts = os.path.relpath(dirpath, root).split(os.sep)
    if any(p in ("test", "tests", "idle_test", "site-packages", "__pycache__") for p in parts):
      continue
    want += [os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/") for f in filenames
             if f.endswith(".py")]
  full = stdlib_corpus()
  assert list(full.ids) == sorted(want) and len(full) > 100
  small, again = stdlib_corpus(max_docs=5), stdlib_corpus(max_docs=5)
  assert small.ids == full.ids[:5] == again.ids and list(small) == list(again)
  with open(os.path.join(root, small.ids[-1]), encoding="utf-8") as f:
    assert small[-1] == f.read() and small[4] == small[-1]
  assert "os.py" in full.ids and not any(i.startswith("test/") for i in full.ids)


def test_split_by_hash_properties():
  keys = [f"doc-{i}" for i in range(20000)]
  splits = [split_by_hash(k, 0.1) for k in keys]
  frac = splits.count("val") / len(keys)
  assert abs(frac - 0.1) < 5 * (0.1 * 0.9 / len(keys)) ** 0.5  # binomial, 5 sigma
  assert all(split_by_hash(k, 0.0) == "train" for k in keys[:100])
  assert all(split_by_hash(k, 1.0) == "val" for k in keys[:100])
  # monotone in the fraction: a val key stays val when the fraction grows
  assert all(split_by_hash(k, 0.3) == "val" for k, s in zip(keys, splits) if s == "val")
  assert [split_by_hash(k, 0.1, salt="x") for k in keys] != splits
  with pytest.raises(ValueError, match="val_fraction"):
    split_by_hash("a", 1.5)


def test_split_by_hash_is_stable_across_interpreters():
  code = ("from jaxlab.data import split_by_hash as s; "
          "print(''.join('v' if s(f'k{i}', .5) == 'val' else 't' for i in range(64)))")
  outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
  assert outs == {"".join("v" if split_by_hash(f"k{i}", .5) == "val" else "t" for i in range(64)) + "\n"}


def test_corpus_split_disjoint_and_covering():
  c = from_texts([f"text number {i}" for i in range(500)])
  tr, va = c.split("train", 0.2), c.split("val", 0.2)
  assert set(tr.ids).isdisjoint(va.ids) and set(tr.ids) | set(va.ids) == set(c.ids)
  assert sorted(list(tr) + list(va)) == sorted(c) and 50 < len(va) < 150
  shuffled = from_texts(list(reversed(c)))
  assert set(shuffled.split("val", 0.2)) == set(va)
  with pytest.raises(ValueError, match="split must be"):
    c.split("test", 0.2)


def test_text_corpus_file_and_paragraph(tmp_path):
  (tmp_path / "sub").mkdir()
  (tmp_path / "b.txt").write_text("para one\nline two\n\n\n  para two  \n \nthird")
  (tmp_path / "sub" / "a.txt").write_text("solo ünï")
  (tmp_path / "skip.md").write_text("not me")
  files = text_corpus(tmp_path)
  assert [os.path.relpath(i, tmp_path) for i in files.ids] == ["b.txt", os.path.join("sub", "a.txt")]
  assert files[1] == "solo ünï"
  paras = text_corpus(tmp_path, per="paragraph")
  assert list(paras) == ["para one\nline two", "para two", "third", "solo ünï"]
  assert len(set(paras.ids)) == 4
  with pytest.raises(FileNotFoundError):
    text_corpus(tmp_path / "nope*.txt")


def test_jsonl_corpus(tmp_path):
  recs = [{"text": f"doc {i} — ☃" * (i + 1), "id": f"r{i}"} for i in range(7)]
  p = tmp_path / "d.jsonl"
  p.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in recs[:4]) + "\n\n"
               + "\n".join(json.dumps(r) for r in recs[4:]))
  c = jsonl_corpus(p)
  assert list(c) == [r["text"] for r in recs] and c[5] == recs[5]["text"]
  assert list(jsonl_corpus(p, id_field="id").ids) == [r["id"] for r in recs]
  with pytest.raises(KeyError, match="body"):
    jsonl_corpus(p, field="body")[0]


def test_parquet_corpus(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  texts = [f"row {i} ✓" for i in range(10)]
  pq.write_table(pa.table({"text": texts[:6], "key": list(range(6))}), tmp_path / "a.parquet", row_group_size=4)
  pq.write_table(pa.table({"text": texts[6:], "key": list(range(6, 10))}), tmp_path / "b.parquet")
  c = parquet_corpus(tmp_path)
  assert list(c) == texts and c.ids[6] == "b.parquet:0"
  assert list(parquet_corpus(tmp_path, id_column="key").ids) == [str(i) for i in range(10)]
  with pytest.raises(KeyError, match="missing"):
    parquet_corpus(tmp_path, column="body")


def test_hf_corpus_offline_error_names_the_hub_and_local_dir_loads(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(RuntimeError, match="hub"):
    hf_corpus("some-org/some-dataset")
  import datasets
  datasets.Dataset.from_dict({"text": ["a", "bb", "ccc"], "n": [1, 2, 3]}).save_to_disk(str(tmp_path / "ds"))
  c = hf_corpus(str(tmp_path / "ds"))
  assert isinstance(c, Corpus) and list(c) == ["a", "bb", "ccc"]
  assert list(hf_corpus(str(tmp_path / "ds"), id_field="n").ids) == ["1", "2", "3"]
