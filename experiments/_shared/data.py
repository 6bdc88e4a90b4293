"""Corpora for the pretraining experiments by spec: "stdlib", "hf:NAME_OR_DIR", or a path."""
from __future__ import annotations

import os

from jaxlab import data as data_lib


def load_corpus(spec: str, max_docs: int | None = None) -> data_lib.Corpus:
  """"stdlib", "hf:NAME_OR_DIR", or a path: *.jsonl / *.parquet files, else plain text files.

  Args:
    spec: the corpus.
    max_docs: keep only the first `max_docs` documents (None: all).
  """
  if spec == "stdlib":
    return data_lib.stdlib_corpus(max_docs)
  if spec.startswith("hf:"):
    docs = data_lib.hf_corpus(spec[3:])
  elif ".jsonl" in spec or (os.path.isdir(spec) and any(f.endswith(".jsonl") for f in os.listdir(spec))):
    docs = data_lib.jsonl_corpus(spec)
  elif ".parquet" in spec or (os.path.isdir(spec) and any(f.endswith(".parquet") for f in os.listdir(spec))):
    docs = data_lib.parquet_corpus(spec)
  else:
    docs = data_lib.text_corpus(spec)
  return docs if max_docs is None else docs.subset(range(min(max_docs, len(docs))))
