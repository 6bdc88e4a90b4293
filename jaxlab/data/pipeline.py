"""Grain pipelines for language modelling: tokenize, pack, shuffle, shard, batch, with checkpointable state.

Documents are sharded per process (disjoint by document), shuffled per epoch with a seed, tokenized with eos
separators and packed into one token stream cut into windows of seq_len + 1 tokens with stride seq_len, so
`inputs = w[:-1]`, `targets = w[1:]` and every stream token after the first is a target exactly once (the GPT-2
recipe, arXiv:2005.14165 §2.2 packing without padding). A window-shuffle buffer decorrelates neighbouring windows.

Batch (numpy int32, B batch, T = seq_len): inputs_BT, targets_BT, loss_mask_BT (1 where the target is a real
token, 0 on padding), segment_ids_BT (1, 2, ... per document piece in the row, 0 = padding) and positions_BT
(index within that piece). The iterator's get_state()/set_state() restore exactly the batches still to come.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
from typing import Any, Sequence

import grain
import numpy as np

from jaxlab.data import corpus as corpus_lib
from jaxlab.data import tokenizers as tok_lib

KEYS = ("inputs", "targets", "loss_mask", "segment_ids", "positions")


class _PackIterator(grain.DatasetIterator):
  """Concatenates token arrays and cuts overlapping windows of seq_len + 1 tokens (stride seq_len).

  State: the parent's state before the oldest document still in the buffer, the offset of the next window's
  first token inside that document, and whether the stream has ended.
  """

  def __init__(self, parent, seq_len: int, pad_id: int, drop_remainder: bool):
    super().__init__(parent)
    self._T, self._pad, self._drop = seq_len, pad_id, drop_remainder
    self._docs: collections.deque[tuple[Any, np.ndarray]] = collections.deque()  # (parent state before, tokens)
    self._offset = 0
    self._buffered = 0  # tokens held in self._docs
    self._exhausted = False
    self._done = False

  def _fetch(self) -> bool:
    state = copy.deepcopy(self._parent.get_state())
    try:
      doc = next(self._parent)
    except StopIteration:
      self._exhausted = True
      return False
    if len(doc):
      self._docs.append((state, np.asarray(doc, np.int32)))
      self._buffered += len(doc)
    return True

  def _pending(self) -> int:
    return self._buffered - self._offset

  def _window(self, n: int):
    toks, segs, pos = [], [], []
    start, need = self._offset, n
    for j, (_, d) in enumerate(self._docs):
      piece = d[start:start + need]
      toks.append(piece)
      segs.append(np.full(len(piece), j + 1, np.int32))
      pos.append(np.arange(len(piece), dtype=np.int32))
      start, need = 0, need - len(piece)
      if need == 0:
        break
    w, s, p = (np.concatenate(a) for a in (toks, segs, pos))
    T, m = self._T, n - 1
    out = {k: np.zeros(T, np.int32) for k in KEYS}
    out["inputs"][:] = self._pad
    out["targets"][:] = self._pad
    out["inputs"][:m], out["targets"][:m], out["loss_mask"][:m] = w[:-1], w[1:], 1
    out["segment_ids"][:m], out["positions"][:m] = s[:-1], p[:-1]
    return out

  def __next__(self):
    if self._done:
      raise StopIteration
    W = self._T + 1
    while self._pending() < W and not self._exhausted:
      self._fetch()
    n = self._pending()
    if n >= W:
      out = self._window(W)
      self._offset += self._T
      while self._offset >= len(self._docs[0][1]):
        done = len(self._docs.popleft()[1])
        self._offset -= done
        self._buffered -= done
      return out
    self._done = True
    if n >= 2 and not self._drop:
      return self._window(n)
    raise StopIteration

  def get_state(self):
    parent = self._docs[0][0] if self._docs else self._parent.get_state()
    return {"parent": copy.deepcopy(parent), "offset": self._offset, "done": self._done}

  def set_state(self, state):
    self._parent.set_state(copy.deepcopy(state["parent"]))
    self._docs, self._offset, self._buffered, self._exhausted = collections.deque(), 0, 0, False
    self._done = bool(state["done"])
    if not self._done:
      while not self._docs and self._fetch():
        pass
      self._offset = int(state["offset"])


class _PackIterDataset(grain.IterDataset):

  def __init__(self, parent, seq_len: int, pad_id: int, drop_remainder: bool):
    super().__init__(parent)
    self._args = (seq_len, pad_id, drop_remainder)

  def __iter__(self):
    return _PackIterator(self._parent.__iter__(), *self._args)

  def __str__(self):
    return f"PackIterDataset(seq_len={self._args[0]})"


class _WindowShuffleIterator(grain.DatasetIterator):
  """Reads `size` elements at a time and yields them in a seeded permutation (numpy; one seed per window).

  State: the parent's state at the current window's start, the window index and the position inside it.
  """

  def __init__(self, parent, size: int, seed: int):
    super().__init__(parent)
    self._size, self._seed = size, seed
    self._start = copy.deepcopy(parent.get_state())
    self._index, self._pos, self._window = -1, 0, []

  def _fill(self):
    self._start = copy.deepcopy(self._parent.get_state())
    items = []
    for _ in range(self._size):
      try:
        items.append(next(self._parent))
      except StopIteration:
        break
    perm = np.random.default_rng([self._seed, self._index]).permutation(len(items))
    self._window, self._pos = [items[i] for i in perm], 0

  def __next__(self):
    if self._pos == len(self._window):
      self._index += 1
      self._fill()
      if not self._window:
        raise StopIteration
    self._pos += 1
    return self._window[self._pos - 1]

  def get_state(self):
    return {"parent": copy.deepcopy(self._start), "window_index": self._index, "pos": self._pos}

  def set_state(self, state):
    self._parent.set_state(copy.deepcopy(state["parent"]))
    self._index, self._window, self._pos = int(state["window_index"]), [], 0
    if self._index >= 0:
      self._fill()
      self._pos = int(state["pos"])
    else:
      self._start = copy.deepcopy(state["parent"])


class _WindowShuffleIterDataset(grain.IterDataset):

  def __init__(self, parent, size: int, seed: int):
    super().__init__(parent)
    self._size, self._seed = size, seed

  def __iter__(self):
    return _WindowShuffleIterator(self._parent.__iter__(), self._size, self._seed)

  def __str__(self):
    return f"WindowShuffleIterDataset(size={self._size})"


def _stack_padded(batch_size: int, pad_id: int):
  def fn(rows: Sequence[dict]):
    out = {k: np.zeros((batch_size, len(rows[0][k])), np.int32) for k in KEYS}
    out["inputs"][:] = pad_id
    out["targets"][:] = pad_id
    for k in KEYS:
      out[k][:len(rows)] = np.stack([r[k] for r in rows])
    return out
  return fn


def as_corpus(source) -> corpus_lib.Corpus:
  """A Corpus, a sequence of strings, or "stdlib"."""
  if isinstance(source, corpus_lib.Corpus):
    return source
  if isinstance(source, str):
    if source == "stdlib":
      return corpus_lib.stdlib_corpus()
    raise ValueError(f"expected a Corpus, a sequence of str or 'stdlib', found the string {source!r}")
  if isinstance(source, Sequence) and all(isinstance(t, str) for t in source):
    return corpus_lib.from_texts(source)
  raise TypeError(f"expected a Corpus, a sequence of str or 'stdlib', found {type(source).__name__}")


@dataclasses.dataclass(frozen=True)
class LMData:
  """Packed next-token batches from a corpus.

  Attributes:
    seq_len: T, tokens per row.
    batch_size: B, rows per batch on this process.
    seed: doc-order and window-buffer shuffle seed (each epoch is reshuffled from it).
    num_epochs: passes over the shard; None repeats forever.
    shuffle: shuffle documents and windows; False keeps corpus order.
    shuffle_buffer: windows held by the window-shuffle buffer (<= 1 disables it).
    add_bos: prepend bos to every document.
    add_eos: append eos to every document (the separator).
    drop_remainder: drop the last partial window and batch; else pad them (loss_mask 0).
    read_threads: grain reader threads tokenizing documents (0 = in the calling thread); the batches do
      not depend on it.
    prefetch: documents buffered by the reader.
  """
  seq_len: int
  batch_size: int
  seed: int = 0
  num_epochs: int | None = None
  shuffle: bool = True
  shuffle_buffer: int = 256
  add_bos: bool = False
  add_eos: bool = True
  drop_remainder: bool = True
  read_threads: int = 4
  prefetch: int = 32

  def __post_init__(self):
    for name in ("seq_len", "batch_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, found {getattr(self, name)}")
    if not 0 <= self.seed < 2**31:
      raise ValueError(f"seed must be in [0, 2**31), found {self.seed}")
    if self.num_epochs is not None and self.num_epochs < 1:
      raise ValueError(f"num_epochs must be >= 1 or None, found {self.num_epochs}")
    if self.read_threads < 0 or self.prefetch < 0:
      raise ValueError(f"read_threads and prefetch must be >= 0, found {self.read_threads}, {self.prefetch}")

  def dataset(self, source, tokenizer, process_index: int | None = None,
              process_count: int | None = None) -> grain.IterDataset:
    """The grain pipeline for one process.

    Args:
      source: a Corpus (or anything `as_corpus` accepts).
      tokenizer: a tokenizer object or a `load_tokenizer` spec.
      process_index: this process's shard; default jax.process_index().
      process_count: number of shards; default jax.process_count().
    """
    docs = as_corpus(source)
    tok = tok_lib.load_tokenizer(tokenizer)
    if self.add_eos and tok.eos_id is None:
      raise ValueError(f"the tokenizer ({type(tok).__name__}, vocab {tok.vocab_size}) has no eos token, which "
                       "separates packed documents; give it one or pass add_eos=False")
    if self.add_bos and tok.bos_id is None:
      raise ValueError(f"add_bos=True but the tokenizer ({type(tok).__name__}) has no bos token")
    if process_index is None or process_count is None:
      import jax
      process_index = jax.process_index() if process_index is None else process_index
      process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
      raise ValueError(f"expected 0 <= process_index < process_count, found {process_index}, {process_count}")
    ds = grain.MapDataset.source(docs)[process_index::process_count]
    if len(ds) == 0:
      raise ValueError(f"process {process_index}/{process_count} has no documents ({len(docs)} in {docs.name})")
    if self.shuffle:
      ds = ds.shuffle(seed=self.seed)
    if self.num_epochs != 1:
      ds = ds.repeat(self.num_epochs)
    add_bos, add_eos = self.add_bos, self.add_eos
    ds = ds.map(lambda text: tok.encode_array(text, add_bos, add_eos))
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=self.read_threads, prefetch_buffer_size=self.prefetch))
    it = _PackIterDataset(it, self.seq_len, tok.batch_pad_id, self.drop_remainder)
    if self.shuffle and self.shuffle_buffer > 1:
      it = _WindowShuffleIterDataset(it, self.shuffle_buffer, self.seed)
    return it.batch(self.batch_size, drop_remainder=self.drop_remainder,
                    batch_fn=_stack_padded(self.batch_size, tok.batch_pad_id))

  def iterator(self, source, tokenizer, process_index: int | None = None,
               process_count: int | None = None) -> grain.DatasetIterator:
    """`iter(self.dataset(...))`: yields batch dicts; has get_state()/set_state()."""
    return iter(self.dataset(source, tokenizer, process_index, process_count))


def lm_batches(source, tokenizer, seq_len: int, batch_size: int, seed: int = 0, split: str | None = "train",
               val_fraction: float = 0.05, process_index: int | None = None, process_count: int | None = None,
               **options) -> grain.DatasetIterator:
  """An iterator of packed LM batches over one hash split of `source`.

  "train" repeats forever with per-epoch reshuffles; "val" is one ordered pass with the tail padded
  (override either with `options`, the other LMData fields).

  Args:
    source: a Corpus, a sequence of str, or "stdlib".
    tokenizer: a tokenizer or a `load_tokenizer` spec ("byte", a tokenizer.json path).
    seq_len: T.
    batch_size: B per process.
    seed: shuffle seed.
    split: "train", "val" (by `split_by_hash` of document ids) or None for every document.
    val_fraction: fraction of documents in "val".
    process_index: this process's shard; default jax.process_index().
    process_count: number of shards; default jax.process_count().
    **options: other LMData fields.

  Returns:
    A grain DatasetIterator yielding dicts of [B, T] int32 arrays (see module docstring).
  """
  docs = as_corpus(source)
  if split is not None:
    docs = docs.split(split, val_fraction)
    if not len(docs):
      raise ValueError(f"split {split!r} with val_fraction={val_fraction} has no documents")
  if split == "val":
    options = {"num_epochs": 1, "shuffle": False, "drop_remainder": False, **options}
  cfg = LMData(seq_len=seq_len, batch_size=batch_size, seed=seed, **options)
  return cfg.iterator(docs, tokenizer, process_index, process_count)
