"""Tokenizers: a byte-level tokenizer for models trained here and a wrapper over any HF `tokenizer.json`.

Both share one interface: `vocab_size`, `bos_id`/`eos_id`/`pad_id`/`mask_id`, `encode(text, add_bos, add_eos)`,
`decode(ids, skip_special)` and `encode_batch(...) -> Encoded(ids, attention_mask)` (numpy int32, [B, L]).
Byte-level modelling as in ByT5 (arXiv:2105.13626): ids 0..255 are the UTF-8 bytes, special tokens follow.
`load(path)` reads a GGUF file's vocabulary (jaxlab.data.gguf_vocab), a tokenizer.json or a transformers
directory; `HFTokenizer.apply_chat_template` renders the model's Jinja chat template in a sandbox, as
transformers' `apply_chat_template` does (same environment options, globals and template variables).
"""
from __future__ import annotations

import json
import os
from typing import NamedTuple, Sequence

import numpy as np


class Encoded(NamedTuple):
  ids: np.ndarray  # [B, L] int32
  attention_mask: np.ndarray  # [B, L] int32, 1 on real tokens


class _Tokenizer:
  """Shared batch logic; subclasses define `encode`, `decode` and the special ids."""
  vocab_size: int
  bos_id: int | None = None
  eos_id: int | None = None
  pad_id: int | None = None
  mask_id: int | None = None

  def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    raise NotImplementedError

  def decode(self, ids, skip_special: bool = True) -> str:
    raise NotImplementedError

  def encode_array(self, text: str, add_bos: bool = False, add_eos: bool = False) -> np.ndarray:
    """`encode` as a 1-D int32 array."""
    return np.asarray(self.encode(text, add_bos, add_eos), np.int32)

  def _wrap(self, ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
    if add_bos:
      ids = [self.require("bos", "add_bos=True")] + ids
    if add_eos:
      ids = ids + [self.require("eos", "add_eos=True")]
    return ids

  def require(self, kind: str, why: str) -> int:
    """The id of special token `kind` ("bos", "eos", "pad", "mask"); a clear error naming `why` when absent."""
    i = getattr(self, f"{kind}_id")
    if i is None:
      raise ValueError(f"{why} needs the {kind} token, but {self!r} has no {kind} token "
                       f"(set {kind}_token in tokenizer_config.json or pass {kind}_token=...)")
    return i

  def _encode_many(self, texts: Sequence[str], add_bos: bool, add_eos: bool) -> list[list[int]]:
    return [self.encode(t, add_bos, add_eos) for t in texts]

  @property
  def batch_pad_id(self) -> int:
    """Id written into padded slots: pad, else eos, else 0 (always masked out)."""
    for i in (self.pad_id, self.eos_id):
      if i is not None:
        return i
    return 0

  def encode_batch(self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False,
                   length: int | None = None, padding_side: str = "right",
                   truncation_side: str = "right") -> Encoded:
    """Encodes and pads a batch of texts.

    Args:
      texts: the strings to encode.
      add_bos: prepend the bos token to every row.
      add_eos: append the eos token to every row.
      length: if given, every row is truncated or padded to exactly this length; else padded to the longest.
      padding_side: "right" (training) or "left" (prompts for generation).
      truncation_side: which end loses tokens when a row exceeds `length`.

    Returns:
      Encoded(ids [B, L] int32, attention_mask [B, L] int32 with 1 on real tokens).
    """
    if isinstance(texts, str):
      raise TypeError("encode_batch expects a sequence of strings, found a single str")
    for name, side in (("padding_side", padding_side), ("truncation_side", truncation_side)):
      if side not in ("left", "right"):
        raise ValueError(f"{name} must be 'left' or 'right', found {side!r}")
    rows = self._encode_many(list(texts), add_bos, add_eos)
    if length is not None:
      if length < 0:
        raise ValueError(f"length must be >= 0, found {length}")
      rows = [r[:length] if truncation_side == "right" else r[max(len(r) - length, 0):] for r in rows]
    L = length if length is not None else max((len(r) for r in rows), default=0)
    ids = np.full((len(rows), L), self.batch_pad_id, np.int32)
    mask = np.zeros((len(rows), L), np.int32)
    for b, r in enumerate(rows):
      n = len(r)
      sl = slice(0, n) if padding_side == "right" else slice(L - n, L)
      ids[b, sl] = r
      mask[b, sl] = 1
    return Encoded(ids, mask)

  def decode_batch(self, ids_BL, attention_mask=None, skip_special: bool = True) -> list[str]:
    ids_BL = np.asarray(ids_BL)
    if attention_mask is None:
      return [self.decode(r, skip_special) for r in ids_BL]
    return [self.decode(r[np.asarray(m) > 0], skip_special) for r, m in zip(ids_BL, attention_mask)]


class ByteTokenizer(_Tokenizer):
  """UTF-8 bytes 0..255, then bos=256, eos=257, pad=258 and (with_mask) mask=259."""
  SPECIALS = ("bos", "eos", "pad", "mask")

  def __init__(self, with_mask: bool = False):
    self.with_mask = with_mask
    self.bos_id, self.eos_id, self.pad_id = 256, 257, 258
    self.mask_id = 259 if with_mask else None
    self.vocab_size = 260 if with_mask else 259

  def __repr__(self):
    return f"ByteTokenizer(with_mask={self.with_mask})"

  def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    if not isinstance(text, str):
      raise TypeError(f"encode expects str, found {type(text).__name__}")
    return self._wrap(list(text.encode("utf-8")), add_bos, add_eos)

  def encode_array(self, text: str, add_bos: bool = False, add_eos: bool = False) -> np.ndarray:
    body = np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
    parts = ([np.array([self.bos_id], np.int32)] if add_bos else []) + [body]
    parts += [np.array([self.eos_id], np.int32)] if add_eos else []
    return np.concatenate(parts)

  def decode(self, ids, skip_special: bool = True) -> str:
    out, buf = [], bytearray()
    for i in np.asarray(ids, np.int64).reshape(-1).tolist():
      if 0 <= i < 256:
        buf.append(i)
        continue
      if not 256 <= i < self.vocab_size:
        raise ValueError(f"token id {i} outside ByteTokenizer vocab [0, {self.vocab_size})")
      if not skip_special:
        out.append(buf.decode("utf-8", errors="replace"))
        buf = bytearray()
        out.append(f"<{self.SPECIALS[i - 256]}>")
    out.append(buf.decode("utf-8", errors="replace"))
    return "".join(out)


def _token_content(value) -> str | None:
  """A special token as written in tokenizer_config.json / special_tokens_map.json (str or AddedToken dict)."""
  if isinstance(value, dict):
    return value.get("content")
  return value if isinstance(value, str) else None


class HFTokenizer(_Tokenizer):
  """Any Hugging Face `tokenizer.json` through the `tokenizers` library.

  `encode` never runs the post-processor (no template specials): bos/eos are added only when asked.
  """

  def __init__(self, tokenizer, *, bos_token: str | None = None, eos_token: str | None = None,
               pad_token: str | None = None, mask_token: str | None = None, unk_token: str | None = None,
               clean_up_tokenization_spaces: bool = False, chat_template: str | None = None, name: str = "hf"):
    self._tok = tokenizer
    self.name = name
    self.chat_template = chat_template
    self.unk_token = unk_token
    self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    self.bos_token, self.eos_token, self.pad_token, self.mask_token = bos_token, eos_token, pad_token, mask_token
    self.bos_id, self.eos_id, self.pad_id, self.mask_id = (
        self._lookup(t) for t in (bos_token, eos_token, pad_token, mask_token))
    self.clean_up = clean_up_tokenization_spaces and type(tokenizer.model).__name__ != "BPE"

  def _lookup(self, token: str | None) -> int | None:
    if token is None:
      return None
    i = self._tok.token_to_id(token)
    if i is None:
      raise ValueError(f"special token {token!r} is not in the vocabulary of {self.name}")
    return i

  def __repr__(self):
    return f"HFTokenizer({self.name!r}, vocab_size={self.vocab_size})"

  @classmethod
  def from_file(cls, path: str, **overrides) -> "HFTokenizer":
    """Loads `tokenizer.json` (or a directory holding it) and its special tokens from the files beside it.

    Args:
      path: a tokenizer.json file or a directory containing one.
      **overrides: bos_token / eos_token / pad_token / mask_token / unk_token / clean_up_tokenization_spaces /
        chat_template, taking precedence over tokenizer_config.json and special_tokens_map.json.
    """
    import tokenizers
    path = os.fspath(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise FileNotFoundError(f"expected a tokenizer.json file or a directory with one, found {path!r}")
    folder = os.path.dirname(os.path.abspath(file))
    cfg = {}
    for fname in ("special_tokens_map.json", "tokenizer_config.json"):  # later file wins
      fpath = os.path.join(folder, fname)
      if os.path.isfile(fpath):
        cfg.update(_read_json(fpath))
    kw = {k: _token_content(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token", "mask_token", "unk_token")}
    kw["clean_up_tokenization_spaces"] = bool(cfg.get("clean_up_tokenization_spaces", False))
    kw["chat_template"] = _chat_template(cfg.get("chat_template"), folder)
    kw.update(overrides)
    text = _read_text(file)
    try:
      json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"{file}: not valid JSON ({e})") from e
    try:
      tok = tokenizers.Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for a schema mismatch
      raise ValueError(f"{file}: valid JSON, but not a tokenizers tokenizer.json (its structure does not match "
                       f"the schema: {e})") from e
    tok.no_padding()  # a fixed padding/truncation saved in the file is for batches; encode_batch pads here
    tok.no_truncation()
    return cls(tok, name=file, **kw)

  @classmethod
  def from_gguf(cls, path, reader=None, **overrides) -> "HFTokenizer":
    """The byte-level BPE tokenizer (and chat template) stored in a GGUF file's metadata.

    Args:
      path: the .gguf file.
      reader: an open `gguf.GGUFReader` of it, to share one parse with the weight loader.
      **overrides: special tokens / chat_template replacing the file's.
    """
    from jaxlab.data import gguf_vocab
    path = os.fspath(path)
    tok, specials, template = gguf_vocab.build(gguf_vocab.read_metadata(path, reader), path)
    kw = {**specials, "chat_template": template, **overrides}
    return cls(tok, name=path, **kw)

  def apply_chat_template(self, messages, *, add_generation_prompt: bool = False, tokenize: bool = False,
                          chat_template: str | None = None, **kwargs):
    """Renders `messages` with the model's chat template, as transformers' `apply_chat_template` does.

    Args:
      messages: a list of {"role": ..., "content": ...} dicts.
      add_generation_prompt: append the template's assistant-turn opener.
      tokenize: return token ids (`encode` of the rendered text, no bos/eos added) instead of the string.
      chat_template: a template overriding the one stored with the tokenizer.
      **kwargs: extra template variables (tools, documents, ...); they override the special tokens.
    """
    template = chat_template or self.chat_template
    if template is None:
      raise ValueError(f"{self!r} has no chat template (none in tokenizer_config.json, chat_template.jinja or "
                       "the GGUF metadata); pass chat_template=...")
    if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) and "role" in m for m in messages):
      raise TypeError(f"messages must be a list of {{'role', 'content'}} dicts, found {messages!r:.120}")
    variables = {k: v for k, v in (("bos_token", self.bos_token), ("eos_token", self.eos_token),
                                   ("unk_token", self.unk_token), ("pad_token", self.pad_token),
                                   ("mask_token", self.mask_token)) if v is not None}
    kwargs.setdefault("tools", None)
    kwargs.setdefault("documents", None)
    text = _compile_template(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                              **{**variables, **kwargs})
    return self.encode(text) if tokenize else text

  def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    if not isinstance(text, str):
      raise TypeError(f"encode expects str, found {type(text).__name__}")
    return self._encode_many([text], add_bos, add_eos)[0]

  def _encode_many(self, texts, add_bos, add_eos):
    # encode_batch_fast skips character offsets and releases the GIL, so the data pipeline's reader threads
    # tokenize in parallel (`Tokenizer.encode` holds the GIL throughout).
    fast = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
    return [self._wrap(e.ids, add_bos, add_eos) for e in fast(list(texts), add_special_tokens=False)]

  def decode(self, ids, skip_special: bool = True) -> str:
    text = self._tok.decode(np.asarray(ids, np.int64).reshape(-1).tolist(), skip_special_tokens=skip_special)
    if self.clean_up:
      for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                   (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


def _read_text(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text ({e})") from e


def _read_json(path: str) -> dict:
  try:
    d = json.loads(_read_text(path))
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from e
  if not isinstance(d, dict):
    raise ValueError(f"{path}: expected a JSON object, found {type(d).__name__}")
  return d


def _chat_template(value, folder: str) -> str | None:
  """tokenizer_config.json's chat_template (a string, or a list of named templates), else chat_template.jinja."""
  if isinstance(value, list):
    named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
    value = named.get("default", next(iter(named.values()), None))
  if value is None and os.path.isfile(os.path.join(folder, "chat_template.jinja")):
    value = _read_text(os.path.join(folder, "chat_template.jinja"))
  return value


_TEMPLATES: dict = {}


def _compile_template(source: str):
  """A Jinja template in an immutable sandbox with transformers' options (trim_blocks, lstrip_blocks,
  loopcontrols) and globals (raise_exception, strftime_now, a non-escaping tojson)."""
  if source in _TEMPLATES:
    return _TEMPLATES[source]
  import datetime

  import jinja2
  import jinja2.ext
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals.update(raise_exception=raise_exception,
                     strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
  _TEMPLATES[source] = env.from_string(source)
  return _TEMPLATES[source]


def load(path, **kwargs) -> "HFTokenizer":
  """The tokenizer of a model: a `.gguf` file, a `tokenizer.json`, or a transformers directory.

  Args:
    path: the file or directory.
    **kwargs: special-token / chat-template overrides (see HFTokenizer.from_file).
  """
  p = os.fspath(path)
  if p.endswith(".gguf"):
    return HFTokenizer.from_gguf(p, **kwargs)
  if os.path.isdir(p) and not os.path.isfile(os.path.join(p, "tokenizer.json")):
    ggufs = sorted(f for f in os.listdir(p) if f.endswith(".gguf"))
    if len(ggufs) == 1:
      return HFTokenizer.from_gguf(os.path.join(p, ggufs[0]), **kwargs)
    raise FileNotFoundError(f"{p}: expected tokenizer.json (or one .gguf file), found {sorted(os.listdir(p))[:10]}")
  return HFTokenizer.from_file(p, **kwargs)


def load_tokenizer(path_or_name, **kwargs):
  """"byte" (or "byte+mask") -> ByteTokenizer; a directory / tokenizer.json / .gguf path -> HFTokenizer.

  Args:
    path_or_name: the tokenizer spec; an already built tokenizer is returned unchanged.
    **kwargs: passed to ByteTokenizer (with_mask) or HFTokenizer.from_file (special-token overrides).
  """
  if isinstance(path_or_name, _Tokenizer):
    return path_or_name
  if path_or_name in ("byte", "byte+mask"):
    return ByteTokenizer(with_mask=kwargs.pop("with_mask", path_or_name == "byte+mask"), **kwargs)
  if isinstance(path_or_name, (str, os.PathLike)):
    p = os.fspath(path_or_name)
    if (os.path.isdir(p) and os.path.isfile(os.path.join(p, "tokenizer.json"))) or (
        os.path.isfile(p) and p.endswith(".json")):
      return HFTokenizer.from_file(p, **kwargs)
    if os.path.isfile(p) and p.endswith(".gguf"):
      return HFTokenizer.from_gguf(p, **kwargs)
  raise ValueError(
      f"load_tokenizer expected 'byte', 'byte+mask', a directory containing tokenizer.json or a path to a "
      f"tokenizer.json or .gguf file; found {path_or_name!r} (hub names are not resolved here: download the files first)")
