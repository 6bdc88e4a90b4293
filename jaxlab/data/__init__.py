"""Data: tokenizers, document corpora and grain LM pipelines (see the submodules' docstrings).

Names are resolved lazily so that `jaxlab.data.corpus` / `.tokenizers` load without importing grain and jax.
"""
import importlib

_EXPORTS = {
    "corpus": ("Corpus", "from_texts", "hf_corpus", "jsonl_corpus", "parquet_corpus", "split_by_hash",
               "stdlib_corpus", "text_corpus"),
    "pipeline": ("KEYS", "LMData", "as_corpus", "lm_batches"),
    "tokenizers": ("ByteTokenizer", "Encoded", "HFTokenizer", "load_tokenizer"),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
  if name in _WHERE:
    return getattr(importlib.import_module(f"jaxlab.data.{_WHERE[name]}"), name)
  raise AttributeError(f"module 'jaxlab.data' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + __all__)
