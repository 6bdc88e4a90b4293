"""bfcl_audio's call-format SFT (call_sft.py): every generated target decodes and passes BFCL's checker against its
own ground truth, irrelevance targets count as not calling, no generated name is a BFCL function name (a collision
is redrawn), held-out functions are disjoint from the training ones, the loss mask covers exactly the assistant
target, a few LoRA steps on a tiny random chat model lower the loss and the merged params are base + scale * A B
with the same logits, and the SFT's splits and config errors."""
import json

import jax
import numpy as np
import pytest

from experiments import bfcl_audio as exp
from experiments.bfcl_audio import bfcl
from experiments.bfcl_audio import call_sft as cs
from experiments.bfcl_audio import run as run_exp
from experiments.runner import splits
from jaxlab.models import transformer as tfm

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _data(n=150, seed=0, forbidden=()):
  return cs.examples(cs.split_domains()[0], n, seed, set(forbidden))


def test_every_target_decodes_and_passes_the_checker_against_its_own_ground_truth():
  exs = _data()["examples"]
  assert {ex["category"] for ex in exs} == set(cs.KINDS)
  for ex in exs:
    assert run_exp.check(cs.item(ex), ex["target"]).valid, ex
    if ex["category"] == "irrelevance":
      with pytest.raises(bfcl.DecodeError):
        bfcl.decode(ex["target"])
      assert not run_exp.check(dict(cs.item(ex), category="live_simple", ground_truth=[{"x": {}}]),
                               ex["target"]).valid
      continue
    calls = bfcl.decode(ex["target"])
    assert bfcl.is_call_list(calls) and len(calls) == len(ex["ground_truth"])
    names = {f["name"] for f in ex["functions"]}
    assert all(next(iter(c)) in names for c in calls)
    for c, t in zip(calls, ex["ground_truth"]):
      (name, args), = c.items()
      assert {p: [v] for p, v in args.items()} == {p: v for p, v in t[name].items() if v != [""]}
      assert set(ex["functions"][[f["name"] for f in ex["functions"]].index(name)]["parameters"]["required"]) <= \
          set(args)


def test_a_wrong_answer_fails_the_checker():
  ex = next(ex for ex in _data()["examples"] if ex["category"] == "simple")
  assert not run_exp.check(cs.item(ex), ex["target"].replace("(", "_x(", 1)).valid
  assert not run_exp.check(cs.item(ex), "I cannot help with that.").valid


def test_irrelevance_requests_ask_for_a_function_not_offered():
  exs = [ex for ex in _data()["examples"] if ex["category"] == "irrelevance"]
  assert exs
  for ex in exs:
    assert ex["asked"] not in {f["name"] for f in ex["functions"]}
    verb, thing = ex["asked"].split("_", 1)
    assert f"{verb} the {thing.replace('_', ' ')}" in ex["text"].lower()


def test_docs_are_in_bfcl_function_format():
  for doc in _data()["functions"]:
    assert set(doc) == {"name", "description", "parameters"} and doc["parameters"]["type"] == "dict"
    props = doc["parameters"]["properties"]
    assert set(doc["parameters"]["required"]) <= set(props)
    for p in props.values():
      assert p["type"] in bfcl.PYTHON_TYPES and p["description"]
      if p["type"] == "array":
        assert p["items"]["type"] == "string"
  kinds = {p["type"] for doc in _data()["functions"] for p in doc["parameters"]["properties"].values()}
  assert kinds == {"string", "integer", "float", "boolean", "array"}
  assert any("enum" in p for doc in _data()["functions"] for p in doc["parameters"]["properties"].values())


def test_no_generated_name_is_a_bfcl_function_name_and_collisions_are_redrawn():
  bfcl_names = cs.bfcl_names(tuple(exp.CATEGORIES))
  assert len(bfcl_names) > 1000
  for seed in range(3):
    names = [f["name"] for f in _data(seed=seed, forbidden=bfcl_names)["functions"]]
    assert not set(names) & bfcl_names and len(set(names)) == len(names)
  d = cs.DOMAINS[0]
  free = f"{cs.VERBS[0]}_{d.things[0]}"
  taken = {f"{v}_{t}" for v in cs.VERBS for t in d.things} - {free}
  assert cs.make_function(d, np.random.default_rng(0), taken)["doc"]["name"] == free
  assert free in taken
  with pytest.raises(ValueError, match="no free function name"):
    cs.make_function(d, np.random.default_rng(0), taken)


def test_no_bfcl_function_mentions_a_generated_domain():
  docs = [f for c in bfcl.AST_CATEGORIES + bfcl.RELEVANCE_CATEGORIES for q in bfcl.load(c)[0] for f in q["function"]]
  text = " ".join((f["name"] + " " + f.get("description", "")).lower().replace("_", " ") for f in docs)
  assert len(docs) > 1000
  for d in cs.DOMAINS:
    assert d.name.replace("_", " ") not in text, d.name


def test_heldout_functions_and_domains_are_disjoint_from_training():
  train_domains, heldout_domains = cs.split_domains()
  assert not {d.name for d in train_domains} & {d.name for d in heldout_domains}
  taken = set()
  train = cs.examples(train_domains, 60, 0, taken)
  heldout = cs.examples(heldout_domains, 30, 1, taken)
  train_names = {f["name"] for f in train["functions"]}
  heldout_names = {f["name"] for f in heldout["functions"]}
  assert not train_names & heldout_names
  assert all(f["name"] in heldout_names for ex in heldout["examples"] for f in ex["functions"])
  out = run_exp.split_items([], [], [], {"train": train["examples"], "heldout": heldout["examples"],
                                         "train_functions": train["functions"],
                                         "heldout_functions": heldout["functions"]})
  assert not splits.overlaps(splits.hashed(out))
  assert out["train"]["functions"] == train["functions"] and out["sft_heldout"]["functions"] == heldout["functions"]
  bad = dict(out, test={"functions": train["functions"][:1], "questions": []})
  assert splits.overlaps(splits.hashed(bad)) == [("test", "functions", 1)]


# ------------------------------------------------------------------------------ a tiny chat model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A ChatML byte-level BPE tokenizer trained on the generated prompts, and a tiny random transformer."""
  from tokenizers import Tokenizer, decoders, models as tmodels, pre_tokenizers, trainers
  from jaxlab.data import tokenizers
  exs = _data(40)["examples"]
  texts = [bfcl.system_prompt(ex["functions"]) + ex["text"] + ex["target"] for ex in exs]
  tk = Tokenizer(tmodels.BPE(unk_token=None))
  tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tk.decoder = decoders.ByteLevel()
  tk.train_from_iterator(texts * 3, trainers.BpeTrainer(
      vocab_size=1200, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  d = tmp_path_factory.mktemp("tiny_chat")
  tk.save(str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                       "chat_template": CHATML}))
  tok = tokenizers.load(str(d))
  cfg = tfm.Config.tiny(vocab_size=-(-tk.get_vocab_size() // 64) * 64, max_position_embeddings=1024,
                        eos_token_id=tok.eos_id, pad_token_id=tok.batch_pad_id)
  return cfg, tfm.init(cfg, jax.random.PRNGKey(0)), tok, exs


def test_the_loss_mask_covers_exactly_the_assistant_target(tiny):
  cfg, _, tok, exs = tiny
  rows = cs.sft_rows(tok, exs[:6])
  assert rows["inputs"].shape[1] % 32 == 0
  for i, ex in enumerate(exs[:6]):
    r = run_exp.request(cs.item(ex), ex["text"])
    prompt = tok.apply_chat_template([{"role": "system", "content": r["system"]}, {"role": "user", "content":
                                      ex["text"]}], add_generation_prompt=True, tokenize=True)
    assert r["system"] == bfcl.system_prompt(ex["functions"])
    on = np.flatnonzero(rows["loss_mask"][i])
    assert on[0] == len(prompt) - 1 and np.all(np.diff(on) == 1)
    assert list(rows["inputs"][i, :len(prompt)]) == list(prompt)
    target = rows["targets"][i, on]
    assert target[-1] == tok.eos_id and tok.decode(target[:-1]) == ex["target"]
    assert rows["loss_mask"][i].sum() == len(tok.encode(ex["target"])) + 1


def test_rows_longer_than_the_cap_are_left_out(tiny):
  _, _, tok, exs = tiny
  lengths = [sum(map(len, cs.prompt_and_target(tok, ex))) for ex in exs]
  cap = int(np.median(lengths))
  kept = cs.fitting(tok, exs, 3, cap, "training")
  assert len(kept) == 3 and all(sum(map(len, cs.prompt_and_target(tok, ex))) <= cap for ex in kept)
  with pytest.raises(ValueError, match="raise sft_max_tokens"):
    cs.fitting(tok, exs, len(exs), cap, "training")


def test_lora_sft_lowers_the_loss_and_the_merged_params_are_base_plus_adapter(tiny):
  from jaxlab import losses
  cfg, params, tok, exs = tiny
  rows = cs.sft_rows(tok, exs[:8])
  nll = jax.jit(losses.sft_loss_fn(cfg))

  def mean_loss(p):
    s, w, _ = nll(p, rows, None)
    return float(s) / float(w)
  before = mean_loss(params)
  merged, hist, adapter = cs.finetune(cfg, params, rows, steps=8, rank=4, lr=1e-2, batch=4, seed=0)
  assert len(hist) == 8 and mean_loss(merged) < before - 0.1
  scale = 2.0  # alpha 2 * rank over rank
  flat_base, flat_merged = cs.lora.flatten(params), cs.lora.flatten(merged)
  adapted = cs.lora.target_paths(params, cs.lora_config(4).targets)
  assert {p.split("/")[-2] for p in adapted} == {"q", "k", "v", "o", "gate", "up", "down"}
  for path, base in flat_base.items():
    if path in adapted:
      leaf = adapter[path]
      want = np.asarray(base, np.float32) + scale * np.einsum("...ir,...ro->...io", np.asarray(leaf["lora_a"]),
                                                              np.asarray(leaf["lora_b"]))
      np.testing.assert_allclose(np.asarray(flat_merged[path]), want, rtol=1e-5, atol=1e-6)
      assert np.abs(np.asarray(leaf["lora_b"])).max() > 0
    else:
      np.testing.assert_array_equal(np.asarray(flat_merged[path]), np.asarray(base))
  hand = params
  for path in adapted:
    leaf = adapter[path]
    hand = cs.lora.set_path(hand, path, cs.lora.get_path(params, path) + scale * np.einsum(
        "...ir,...ro->...io", np.asarray(leaf["lora_a"]), np.asarray(leaf["lora_b"])))
  x = rows["inputs"][:2]
  np.testing.assert_allclose(np.asarray(tfm.forward(merged, x, cfg).logits),
                             np.asarray(tfm.forward(hand, x, cfg).logits), rtol=1e-4, atol=1e-4)


def test_heldout_accuracy_scores_with_the_evaluation_checker(tiny):
  _, _, _, exs = tiny
  outs = [ex["target"] if i % 2 == 0 else "Sure, here it is." for i, ex in enumerate(exs[:10])]
  got = cs.heldout_accuracy(exs[:10], outs)
  want = [i % 2 == 0 or ex["category"] == "irrelevance" for i, ex in enumerate(exs[:10])]
  assert [r["valid"] for r in got["rows"]] == want and got["accuracy"] == np.mean(want)


@pytest.mark.parametrize("kw,match", [
    (dict(sft_steps=-1), "sft_steps must be >= 0, found -1"),
    (dict(sft_rank=0), "sft_rank must be >= 1, found 0"),
    (dict(sft_batch=0), "sft_batch must be >= 1, found 0"),
    (dict(sft_lr=0.0), "sft_lr must be positive"),
    (dict(sft_steps=2, mesh="fsdp"), "the call-format SFT runs on one device"),
])
def test_bad_sft_config_is_a_one_line_error(kw, match):
  with pytest.raises(ValueError, match=match) as e:
    exp.Config(**kw)
  assert "\n" not in str(e.value)


def test_prepare_and_tune_record_the_declared_results(tiny):
  import dataclasses
  from experiments import registry
  cfg, params, tok, _ = tiny
  forbidden = cs.bfcl_names(("simple", "multiple"))
  run_cfg = exp.Config(sft_steps=3, sft_examples=8, sft_heldout=6, sft_rank=4, sft_batch=2, sft_lr=1e-2,
                       sft_max_tokens=1024)
  data = cs.prepare(run_cfg, tok, forbidden)
  assert len(data["train"]) == 8 and len(data["heldout"]) == 6
  train_names = {f["name"] for f in data["train_functions"]}
  heldout_names = {f["name"] for f in data["heldout_functions"]}
  assert not train_names & heldout_names and not (train_names | heldout_names) & forbidden
  assert {ex["domain"] for ex in data["heldout"]} <= {d.name for d in cs.split_domains()[1]}
  seen = []

  def generate_with(p):
    seen.append(p)
    return lambda reqs: [ex["target"] if i < 3 else "no" for i, ex in enumerate(data["heldout"][:len(reqs)])]
  merged, res, rows = cs.tune(run_cfg, (cfg, params, tok), data, generate_with)
  assert seen == [merged] and len(rows) == 6
  want = np.mean([i < 3 or ex["category"] == "irrelevance" for i, ex in enumerate(data["heldout"])])
  assert res["sft.heldout_accuracy"] == want and res["sft.examples"] == 8 and res["sft.heldout_examples"] == 6
  assert res["sft.loss_last"] < res["sft.loss_first"]
  registry.get("bfcl_audio").check_results(dict(res, items=0, **{f"failures.text.{k}": 0 for k in exp.FAILURES}))
  assert dataclasses.replace(run_cfg, sft_steps=0).sft_steps == 0


@pytest.mark.slow
def test_cpu_preset_plans_the_sft_step_and_its_heldout_generations():
  from experiments.runner import plan as plan_lib
  p = plan_lib.plan("bfcl_audio", "cpu", "cpu-8", ["suites=text"])
  by_name = {w["name"]: w for w in p["workloads"]}
  assert list(by_name) == ["generate", "sft_train_step", "generate.sft_heldout"]
  sft = by_name["sft_train_step"]
  assert sft["kind"] == "train" and sft["steps"] == exp.PRESETS["cpu"].sft_steps
  assert 0.65 <= sft["flops_per_step"] / sft["analytic_flops_per_step"] <= 1.5
