"""A `tokenizers.Tokenizer` rebuilt from a GGUF file's tokenizer metadata (llama.cpp's key names).

A GGUF carries no tokenizer.json: `tokenizer.ggml.model` names the algorithm ("gpt2": byte-level BPE),
`tokenizer.ggml.tokens` / `.merges` / `.token_type` the vocabulary, `tokenizer.ggml.pre` the pre-tokenizer
(the regexes llama.cpp splits text with, src/llama-vocab.cpp), `tokenizer.ggml.{bos,eos,padding,unknown}_token_id`
the special ids and `tokenizer.chat_template` the chat template. Tokens typed CONTROL (3) become special added
tokens, USER_DEFINED (4) plain added tokens, so both match whole in text as llama.cpp matches them.
"""
from __future__ import annotations

import os

# llama.cpp's split regexes per `tokenizer.ggml.pre`; each applied in order, then byte-level encoding.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
SPLITS = {
    **dict.fromkeys(("default", "gpt2", "gpt-2", "mpt", "olmo", "jais"), (_GPT2,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"),
                    (r"\p{N}", _GPT2)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"), (_LLAMA3,)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), (_QWEN2,)),
}
CONTROL, USER_DEFINED = 3, 4


def read_metadata(path, reader=None) -> dict:
  """Every key/value of a GGUF file's metadata (arrays as lists), read through the `gguf` package.

  Args:
    path: the .gguf file.
    reader: an already open `gguf.GGUFReader` of `path` (parsing one takes seconds for a 49k vocabulary).
  """
  if reader is not None:
    return {k: f.contents() for k, f in reader.fields.items() if f.types and not k.startswith("GGUF.")}
  return read_metadata(path, open_reader(path))


def open_reader(path):
  """A memory-mapped `gguf.GGUFReader` over `path`; a missing, foreign or truncated file is refused by name."""
  try:
    import gguf
  except ImportError as e:
    raise ImportError("reading GGUF files needs the gguf package: pip install gguf") from e
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"expected a .gguf file, found no file at {path!r}")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != b"GGUF":
    raise ValueError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF'; {size} bytes)")
  try:
    reader = gguf.GGUFReader(path)
  except (ValueError, IndexError, KeyError, OverflowError, TypeError) as e:
    raise ValueError(f"{path}: GGUF header or tensor table unreadable in a file of {size} bytes "
                     f"(truncated or corrupt?): {e}") from e
  return reader


def build(md: dict, source: str = "gguf"):
  """(tokenizers.Tokenizer, special tokens dict, chat template or None) from GGUF metadata.

  Args:
    md: `read_metadata(path)`.
    source: the file name, for error messages.
  """
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
  kind = md.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise NotImplementedError(f"{source}: GGUF tokenizer model {kind!r} is not supported; jaxlab builds 'gpt2' "
                              "(byte-level BPE) vocabularies")
  tokens = md.get("tokenizer.ggml.tokens")
  merges = md.get("tokenizer.ggml.merges")
  if not tokens or merges is None:
    raise ValueError(f"{source}: GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
  pre = md.get("tokenizer.ggml.pre", "default")
  if pre not in SPLITS:
    raise NotImplementedError(f"{source}: GGUF pre-tokenizer {pre!r} is not supported; known: {sorted(SPLITS)}")
  vocab = {t: i for i, t in enumerate(tokens)}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False))
  tok.pre_tokenizer = pre_tokenizers.Sequence(
      [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in SPLITS[pre]]
      + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t, ty in zip(tokens, types) if ty == CONTROL])
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED])
  if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
    raise ValueError(f"{source}: {len(tokens)} GGUF tokens built a vocabulary of "
                     f"{tok.get_vocab_size(with_added_tokens=True)} (duplicate tokens?)")
  specials = {}
  for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding"), ("unk_token", "unknown")):
    i = md.get(f"tokenizer.ggml.{key}_token_id")
    if i is not None:
      if not 0 <= i < len(tokens):
        raise ValueError(f"{source}: tokenizer.ggml.{key}_token_id {i} outside the vocabulary [0, {len(tokens)})")
      specials[name] = tokens[i]
  return tok, specials, md.get("tokenizer.chat_template")
