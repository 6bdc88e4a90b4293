"""Document corpora with stable ids: CPython's stdlib sources, text files, JSONL, parquet, HF `datasets`.

A `Corpus` is a random-access sequence of document strings (so grain's `MapDataset.source` can index it) with
one stable string id per document; `split_by_hash` assigns each id to "train" or "val" by a hashlib digest so
the two splits never overlap and do not depend on order, process or Python's hash seed.
"""
from __future__ import annotations

import collections.abc
import glob
import hashlib
import json
import os
import re
import socket
import sysconfig
from typing import Callable, Iterator, Sequence
from urllib.parse import urlparse

SPLITS = ("train", "val")


def split_by_hash(key: str, val_fraction: float, salt: str = "") -> str:
  """"val" for a stable `val_fraction` of keys (doc ids or texts), "train" for the rest.

  Args:
    key: a document id (or the text itself when there is no id).
    val_fraction: fraction in [0, 1] of the key space assigned to "val".
    salt: changes the assignment while keeping it deterministic.
  """
  if not 0.0 <= val_fraction <= 1.0:
    raise ValueError(f"val_fraction must be in [0, 1], found {val_fraction}")
  digest = hashlib.sha256((salt + "\x00" + key).encode("utf-8", "surrogatepass")).digest()
  return "val" if int.from_bytes(digest[:8], "big") < val_fraction * 2.0 ** 64 else "train"


class Corpus(collections.abc.Sequence):
  """Random-access documents: `corpus[i]` is the text of document i, `corpus.ids[i]` its stable id."""

  def __init__(self, ids: Sequence[str], fetch: Callable[[int], str], name: str = "corpus"):
    self._ids = tuple(ids)
    self._fetch = fetch
    self.name = name

  def __len__(self) -> int:
    return len(self._ids)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return self.subset(range(len(self))[i])
    n = len(self)
    if not -n <= i < n:
      raise IndexError(f"document index {i} out of range for {self.name} with {n} documents")
    return self._fetch(i % n)

  def __repr__(self):
    return f"Corpus({self.name!r}, {len(self)} docs)"

  @property
  def ids(self) -> tuple[str, ...]:
    return self._ids

  def items(self) -> Iterator[tuple[str, str]]:
    """(id, text) pairs in order."""
    for i, doc_id in enumerate(self._ids):
      yield doc_id, self._fetch(i)

  def subset(self, indices: Sequence[int], name: str | None = None) -> "Corpus":
    idx = list(indices)
    return Corpus([self._ids[i] for i in idx], lambda j: self._fetch(idx[j]), name or self.name)

  def split(self, which: str, val_fraction: float, salt: str = "") -> "Corpus":
    """The documents whose id `split_by_hash` assigns to `which` ("train" or "val")."""
    if which not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, found {which!r}")
    keep = [i for i, d in enumerate(self._ids) if split_by_hash(d, val_fraction, salt) == which]
    return self.subset(keep, f"{self.name}[{which}]")


def from_texts(texts: Sequence[str], ids: Sequence[str] | None = None, name: str = "texts") -> Corpus:
  """An in-memory corpus; default ids are content hashes (duplicates share a split)."""
  texts = list(texts)
  if ids is None:
    ids = [hashlib.sha1(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]
  elif len(ids) != len(texts):
    raise ValueError(f"expected one id per text ({len(texts)}), found {len(ids)}")
  return Corpus(ids, texts.__getitem__, name)


def _read_text(path: str) -> str:
  with open(path, encoding="utf-8", errors="replace") as f:
    return f.read()


_STDLIB_SKIP = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_corpus(max_docs: int | None = None) -> Corpus:
  """CPython's standard-library `.py` sources of the running interpreter, one document per file.

  Files are sorted by relative path (the id); test directories and site-packages are skipped.

  Args:
    max_docs: keep only the first `max_docs` files (a small deterministic subset for tests).
  """
  root = sysconfig.get_paths()["stdlib"]
  rel = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP)
    rel.extend(os.path.relpath(os.path.join(dirpath, f), root) for f in filenames if f.endswith(".py"))
  rel = sorted(r.replace(os.sep, "/") for r in rel)[:max_docs]
  if not rel:
    raise FileNotFoundError(f"no .py files found under the stdlib path {root!r}")
  return Corpus(rel, lambda i: _read_text(os.path.join(root, rel[i])), "stdlib")


def _expand(paths, pattern: str) -> list[str]:
  """Files named by a path, a glob, a directory (searched recursively for `pattern`) or a list of these."""
  items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
  out = []
  for p in map(os.fspath, items):
    if os.path.isdir(p):
      out.extend(sorted(glob.glob(os.path.join(p, "**", pattern), recursive=True)))
    elif os.path.isfile(p):
      out.append(p)
    else:
      found = sorted(glob.glob(p))
      if not found:
        raise FileNotFoundError(f"expected a file, directory or glob, found no match for {p!r}")
      out.extend(found)
  if not out:
    raise FileNotFoundError(f"no files matching {pattern!r} under {items}")
  return out


def text_corpus(paths, per: str = "file", pattern: str = "*.txt") -> Corpus:
  """Plain-text files: one document per file, or per blank-line-separated paragraph.

  Args:
    paths: file(s), glob(s) or directories (searched recursively for `pattern`).
    per: "file" or "paragraph".
    pattern: file-name glob used inside directories.
  """
  files = _expand(paths, pattern)
  if per == "file":
    return Corpus(files, lambda i: _read_text(files[i]), "text")
  if per != "paragraph":
    raise ValueError(f"per must be 'file' or 'paragraph', found {per!r}")
  ids, texts = [], []
  for f in files:
    paras = [p.strip() for p in re.split(r"\n[ \t\r\f\v]*\n", _read_text(f))]
    for k, p in enumerate(q for q in paras if q):
      ids.append(f"{f}#{k}")
      texts.append(p)
  return Corpus(ids, texts.__getitem__, "text-paragraphs")


def jsonl_corpus(paths, field: str = "text", id_field: str | None = None, pattern: str = "*.jsonl") -> Corpus:
  """JSON-lines files, one document per non-empty line, read lazily through byte offsets.

  Args:
    paths: file(s), glob(s) or directories.
    field: the key holding the document text.
    id_field: key holding a stable id; default "<file>:<line number>".
    pattern: file-name glob used inside directories.
  """
  files = _expand(paths, pattern)
  ids, where = [], []
  for f in files:
    with open(f, "rb") as fh:
      off = 0
      for ln, line in enumerate(fh):
        if line.strip():
          where.append((f, off, len(line)))
          ids.append(f"{f}:{ln}" if id_field is None else None)
        off += len(line)

  def record(i):
    f, off, n = where[i]
    with open(f, "rb") as fh:
      fh.seek(off)
      rec = json.loads(fh.read(n))
    if field not in rec:
      raise KeyError(f"{f} line at byte {off}: expected field {field!r}, found keys {sorted(rec)}")
    return rec

  if id_field is not None:
    ids = [str(record(i)[id_field]) for i in range(len(where))]
  return Corpus(ids, lambda i: record(i)[field], "jsonl")


def parquet_corpus(paths, column: str = "text", id_column: str | None = None, pattern: str = "*.parquet") -> Corpus:
  """Parquet files, one document per row of `column` (held as Arrow arrays, converted per access).

  Args:
    paths: file(s), glob(s) or directories.
    column: the string column holding the documents.
    id_column: column holding stable ids; default "<file basename>:<row>".
    pattern: file-name glob used inside directories.
  """
  import pyarrow as pa
  import pyarrow.parquet as pq
  chunks, ids = [], []
  for f in _expand(paths, pattern):
    names = pq.read_schema(f).names
    want = [column] + ([id_column] if id_column else [])
    missing = [c for c in want if c not in names]
    if missing:
      raise KeyError(f"{f}: expected columns {want}, missing {missing}; found {names}")
    table = pq.read_table(f, columns=want)
    chunks.extend(table.column(column).chunks)
    if id_column:
      ids.extend(str(x) for x in table.column(id_column).to_pylist())
    else:
      ids.extend(f"{os.path.basename(f)}:{r}" for r in range(table.num_rows))
  texts = pa.chunked_array(chunks, type=chunks[0].type if chunks else pa.string())
  return Corpus(ids, lambda i: texts[i].as_py(), "parquet")


def _offline() -> bool:
  return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
             for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_reachable(timeout: float = 3.0) -> bool:
  url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
  try:
    with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
      return True
  except OSError:
    return False


def hf_corpus(name: str, split: str = "train", field: str = "text", config: str | None = None,
              id_field: str | None = None) -> Corpus:
  """A Hugging Face `datasets` dataset: a local `save_to_disk` directory, or a hub name when the hub is reachable.

  Args:
    name: hub dataset name or local directory.
    split: dataset split.
    field: column holding the text.
    config: hub config name.
    id_field: column holding stable ids; default "<name>/<split>:<row>".
  """
  import datasets
  if os.path.isdir(name) and (os.path.isfile(os.path.join(name, "state.json"))
                              or os.path.isfile(os.path.join(name, "dataset_dict.json"))):
    ds = datasets.load_from_disk(name)
    ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
  else:
    if not os.path.isdir(name):
      if _offline():
        raise RuntimeError(f"cannot load dataset {name!r}: the Hugging Face hub is disabled (HF_HUB_OFFLINE / "
                           "HF_DATASETS_OFFLINE is set). Use a local path: jsonl_corpus, parquet_corpus, "
                           "text_corpus, or a directory written by Dataset.save_to_disk")
      if not _hub_reachable():
        raise RuntimeError(f"cannot load dataset {name!r}: the Hugging Face hub is not reachable from this "
                           "machine. Use a local path: jsonl_corpus, parquet_corpus, text_corpus, or a "
                           "directory written by Dataset.save_to_disk")
    ds = datasets.load_dataset(name, config, split=split)
  if field not in ds.column_names:
    raise KeyError(f"dataset {name!r}: expected column {field!r}, found {ds.column_names}")
  ids = ([str(x) for x in ds[id_field]] if id_field else [f"{name}/{split}:{r}" for r in range(len(ds))])
  return Corpus(ids, lambda i: ds[int(i)][field], f"hf:{name}")
