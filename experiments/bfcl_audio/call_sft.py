"""Teaching the chat LM BFCL's call format (experiments/bfcl_audio/README.md, "Call-format SFT").

`examples` draws function-calling examples over functions generated here in hobby and craft domains BFCL does not
cover (`DOMAINS`): each function has typed parameters (strings, enums, integers, floats, booleans, string lists;
required and optional) documented in BFCL's function-doc format; each request is built from templates and its
target is the Python call list BFCL's prompt-style system prompt asks for (`bfcl.decode` parses it), or, for an
irrelevance example (a request that none of the offered functions serves), a sentence that decodes to no call.
No generated name equals a name in `forbidden` (the BFCL functions a run loads; a collision is redrawn), and the
training and held-out functions come from disjoint domains (`split_domains`).

`sft_rows` renders each example with the evaluation's own prompt (`chat.request` -> `chat_ids`, BFCL's system
prompt and the model's chat template) and puts the loss on the assistant target only (its tokens and the end of
turn); `finetune` trains a LoRA adapter on it with jaxlab's train step and returns the merged params;
`heldout_accuracy` scores greedy answers on held-out functions with the evaluation's checker (`chat.check`).
"""
from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
import optax

from experiments._shared.adapters import sft_batches
from experiments._shared.chat_models import chat_ids
from experiments.bfcl_audio.chat import chat_generator, check, request
from jaxlab import losses
from jaxlab.adapters import lora
from jaxlab.rl.dpo import sft_batch
from jaxlab.train import state as state_lib
from jaxlab.train import step as step_lib

KINDS = ("simple", "multiple", "parallel", "parallel_multiple", "irrelevance")
LORA_TARGETS = lora.ALL_LINEAR


@dataclasses.dataclass(frozen=True)
class Domain:
  name: str
  things: tuple[str, ...]
  names: tuple[str, ...]
  enums: tuple[tuple[str, tuple[str, ...]], ...]
  measures: tuple[tuple[str, str, str, int, int], ...]  # (param, words, type, low, high)
  lists: tuple[tuple[str, tuple[str, ...]], ...]
  flags: tuple[str, ...]


DOMAINS = (
    Domain("beekeeping", ("hive", "swarm", "honey_batch"), ("Amber Hill", "Clover Row", "North Meadow", "Linden Yard"),
           (("frame_style", ("langstroth", "warre", "top_bar")), ("smoke_fuel", ("pine_needles", "burlap", "cotton"))),
           (("frame_count", "frames", "integer", 4, 20), ("brood_temperature", "degrees", "float", 30, 37)),
           (("flower_sources", ("clover", "linden", "heather", "lavender", "acacia")),), ("requeen", "feed_syrup")),
    Domain("origami", ("crane_model", "paper_sheet", "fold_diagram"), ("Silver Crane", "Paper Lotus", "Blue Frog"),
           (("paper_kind", ("kami", "washi", "tant", "foil")), ("base_fold", ("bird_base", "frog_base", "waterbomb"))),
           (("sheet_size", "centimeters", "integer", 10, 60), ("crease_depth", "millimeters", "float", 1, 5)),
           (("colors", ("red", "teal", "gold", "ivory", "plum")),), ("wet_fold", "reverse_side")),
    Domain("falconry", ("falcon", "mews", "hunting_flight"), ("Storm", "Kestrel Nine", "Ash Wing", "Valkyrie"),
           (("hood_style", ("dutch", "anglo_indian", "bahraini")), ("lure_type", ("wing_lure", "bag_lure", "drag"))),
           (("flight_weight", "grams", "integer", 500, 1400), ("creance_length", "meters", "float", 10, 60)),
           (("jesses", ("leather", "nylon", "kangaroo_hide")),), ("telemetry", "hooded_transport")),
    Domain("lighthouse_keeping", ("lamp", "fog_signal", "watch_shift"), ("Gull Point", "Cape Ardent", "Heron Rock"),
           (("lens_order", ("first", "second", "third", "fourth")), ("signal_pattern", ("fixed", "flashing",
                                                                                      "occulting"))),
           (("rotation_period", "seconds", "integer", 5, 30), ("wick_height", "centimeters", "float", 1, 9)),
           (("keepers", ("Mara", "Tobias", "Ines", "Quill")),), ("storm_mode", "backup_lamp")),
    Domain("kite_making", ("kite", "kite_line", "spar_frame"), ("Sky Dancer", "Red Box", "Night Delta"),
           (("sail_fabric", ("ripstop", "tyvek", "silk")), ("bridle_type", ("two_leg", "three_leg", "four_leg"))),
           (("wingspan", "centimeters", "integer", 60, 300), ("line_strength", "kilograms", "float", 5, 90)),
           (("tail_colors", ("orange", "violet", "lime", "white")),), ("night_lights", "carbon_spars")),
    Domain("bonsai", ("bonsai_tree", "pruning_session", "repotting"), ("Old Juniper", "Maple Seven", "Twin Pine"),
           (("styling", ("formal_upright", "cascade", "windswept", "literati")), ("soil_mix", ("akadama", "pumice",
                                                                                            "lava_rock"))),
           (("tree_age", "years", "integer", 3, 90), ("wire_gauge", "millimeters", "float", 1, 6)),
           (("tools", ("concave_cutter", "knob_cutter", "jin_pliers", "root_hook")),), ("defoliate", "wire_trunk")),
    Domain("glassblowing", ("gather", "glass_vase", "annealing_run"), ("Cobalt Swirl", "Amber Teardrop", "Sea Bowl"),
           (("glass_color", ("cobalt", "amber", "ruby", "clear")), ("finish", ("matte", "gloss", "frosted"))),
           (("furnace_temperature", "degrees", "integer", 900, 1200), ("wall_thickness", "millimeters", "float", 2,
                                                                       9)),
           (("frit_colors", ("green", "copper", "opal", "smoke")),), ("use_pipe_cooler", "sandblast")),
    Domain("puppetry", ("marionette", "puppet_show", "string_rig"), ("Captain Pip", "Old Grete", "Moth King"),
           (("control_bar", ("horizontal", "vertical", "paddle")), ("stage_light", ("amber", "blue", "spot"))),
           (("string_count", "strings", "integer", 6, 24), ("puppet_height", "centimeters", "float", 20, 90)),
           (("voices", ("narrator", "villain", "fox", "queen")),), ("shadow_scene", "live_music")),
    Domain("tea_blending", ("tea_blend", "steeping", "tasting_flight"), ("Morning Ember", "Jade Mist", "Dusk Chai"),
           (("leaf_grade", ("whole_leaf", "broken", "fannings")), ("base_tea", ("oolong", "sencha", "puerh",
                                                                                "assam"))),
           (("steep_seconds", "seconds", "integer", 30, 300), ("water_temperature", "degrees", "float", 70, 99)),
           (("botanicals", ("bergamot", "rose", "ginger", "cardamom", "mint")),), ("decaffeinate", "cold_brew")),
    Domain("quilting", ("quilt", "quilt_block", "binding"), ("Prairie Star", "Log Cabin Nine", "Winter Rose"),
           (("batting", ("cotton", "wool", "bamboo")), ("stitch_pattern", ("stipple", "crosshatch", "echo"))),
           (("block_count", "blocks", "integer", 4, 64), ("seam_allowance", "centimeters", "float", 0, 2)),
           (("fabrics", ("calico", "linen", "chambray", "flannel")),), ("hand_quilted", "prewash")),
    Domain("model_railways", ("locomotive", "track_layout", "signal_box"), ("Valley Line", "Coal Spur", "Brass Eagle"),
           (("scale", ("oo_gauge", "ho_gauge", "n_gauge")), ("era", ("steam", "diesel", "electric"))),
           (("wagon_count", "wagons", "integer", 2, 40), ("gradient_percent", "percent", "float", 0, 4)),
           (("stations", ("Millbrook", "Fernside", "Oakhurst", "Dunmore")),), ("digital_control", "sound_module")),
    Domain("calligraphy", ("scroll", "ink_stick", "lettering_sheet"), ("Spring Verse", "Moon Poem", "Guild Charter"),
           (("script", ("copperplate", "italic", "uncial", "gothic")), ("nib", ("broad", "pointed", "brush"))),
           (("line_count", "lines", "integer", 2, 30), ("x_height", "millimeters", "float", 3, 12)),
           (("inks", ("sumi", "iron_gall", "walnut", "vermilion")),), ("gilding", "ruled_guides")),
    Domain("candle_making", ("candle", "wax_pour", "wick_test"), ("Cedar Glow", "Fig Lantern", "Harbor Light"),
           (("wax", ("soy", "beeswax", "paraffin", "coconut")), ("vessel", ("tin", "jar", "pillar"))),
           (("burn_hours", "hours", "integer", 10, 80), ("fragrance_load", "percent", "float", 3, 12)),
           (("scents", ("cedar", "fig", "vanilla", "smoke", "citrus")),), ("double_wick", "dye_layers")),
    Domain("bell_ringing", ("bell_tower", "peal", "ringing_band"), ("St Aldric", "Holloway Tower", "Marsh Chapel"),
           (("method", ("plain_bob", "grandsire", "stedman")), ("stage", ("minor", "major", "royal"))),
           (("change_count", "changes", "integer", 120, 5040), ("tenor_weight", "hundredweight", "float", 5, 40)),
           (("ringers", ("Edith", "Rowan", "Bartholomew", "Nell")),), ("muffled", "half_pull")),
    Domain("cheese_aging", ("cheese_wheel", "aging_cave", "rind_wash"), ("Alpine Ridge", "Blue Hollow", "Stone Tomme"),
           (("milk", ("cow", "goat", "sheep", "buffalo")), ("rind", ("natural", "washed", "bloomy", "waxed"))),
           (("aging_weeks", "weeks", "integer", 2, 104), ("cave_humidity", "percent", "float", 80, 98)),
           (("cultures", ("penicillium", "linens", "geotrichum")),), ("brine_bath", "turn_daily")),
    Domain("hot_air_ballooning", ("balloon", "launch", "burner_check"), ("Sunrise Nine", "Patchwork", "Red Lantern"),
           (("envelope", ("nylon", "polyester", "hyperlast")), ("basket", ("wicker", "rattan", "aluminium"))),
           (("passenger_count", "passengers", "integer", 1, 16), ("fuel_load", "liters", "float", 40, 240)),
           (("waypoints", ("Hollow Farm", "Mill Pond", "Ridge Field")),), ("tethered", "dawn_launch")),
)
VERBS = ("schedule", "inspect", "log", "estimate", "reserve", "register", "adjust", "order", "cancel", "record",
         "prepare", "assess", "archive", "rotate")
OPENERS = ("Please {verb} the {thing}", "Could you {verb} the {thing}", "I need to {verb} the {thing}",
           "{Verb} the {thing}", "Can you {verb} the {thing}", "I'd like you to {verb} the {thing}")
SECOND = ("and also {verb} another {thing}", "then {verb} one more {thing}", "and separately {verb} a {thing}")
REFUSALS = ("None of the given functions can {verb} the {thing}.", "The provided functions cannot {verb} the {thing}.",
            "No available function can {verb} a {thing}.")


def split_domains(heldout: int = 4) -> tuple[tuple[Domain, ...], tuple[Domain, ...]]:
  """(training domains, held-out domains): the last `heldout` of DOMAINS are held out."""
  return DOMAINS[:-heldout], DOMAINS[-heldout:]


def _words(name: str) -> str:
  return name.replace("_", " ")


def _param_pool(d: Domain, thing: str) -> list[tuple[str, dict, callable, callable]]:
  """(param, doc, draw(rng) -> value, phrase(value) -> words) for every parameter a function on `thing` may take."""
  out = [(f"{thing}_name", {"type": "string", "description": f"The name of the {_words(thing)}."},
          lambda r: str(r.choice(d.names)), lambda v: _phrase(v, ("named {v}", "called {v}")))]
  for p, opts in d.enums:
    out.append((p, {"type": "string", "enum": list(opts), "description": f"The {_words(p)}, one of {list(opts)}."},
                lambda r, o=opts: str(r.choice(o)), lambda v, p=p: f"with {_words(p)} {_words(v)}"))
  for p, unit, kind, lo, hi in d.measures:
    if kind == "integer":
      draw = (lambda r, lo=lo, hi=hi: int(r.integers(lo, hi + 1)))
    else:
      draw = (lambda r, lo=lo, hi=hi: round(float(r.uniform(lo, hi)), 1))
    out.append((p, {"type": kind, "description": f"The {_words(p)} in {unit}."}, draw,
                lambda v, p=p, unit=unit: f"with {_words(p)} of {v} {unit}"))
  for p, opts in d.lists:
    out.append((p, {"type": "array", "items": {"type": "string"}, "description": f"The {_words(p)}."},
                lambda r, o=opts: [str(x) for x in r.choice(o, size=int(r.integers(2, 4)), replace=False)],
                lambda v, p=p: f"with {_words(p)} {', '.join(_words(x) for x in v[:-1])} and {_words(v[-1])}"))
  for p in d.flags:
    out.append((p, {"type": "boolean", "description": f"Whether to {_words(p)}. Default: false."},
                lambda r: bool(r.integers(2)), lambda v, p=p: f"{'with' if v else 'without'} {_words(p)}"))
  return out


def _phrase(v, templates) -> str:
  """One of `templates` for `v`, chosen by its text (a value is always phrased alike)."""
  return templates[sum(map(ord, str(v))) % len(templates)].format(v=v)


def make_function(d: Domain, rng, forbidden: set[str]) -> dict:
  """One function of domain `d` whose name is not in `forbidden` (drawn again until it is not): its BFCL doc, the
  verb and thing of its name, and its parameters' samplers; the name is added to `forbidden`."""
  for _ in range(1000):
    verb, thing = str(rng.choice(VERBS)), str(rng.choice(d.things))
    name = f"{verb}_{thing}"
    if name not in forbidden:
      break
  else:
    raise ValueError(f"no free function name left in domain {d.name!r}")
  forbidden.add(name)
  pool = _param_pool(d, thing)
  first, rest = pool[0], [pool[i] for i in rng.permutation(np.arange(1, len(pool)))]
  params = [first] + rest[:int(rng.integers(1, 4))]
  required = [p[0] for p in params[:int(rng.integers(1, len(params) + 1))]]
  doc = {"name": name, "description": f"{verb.capitalize()} a {_words(thing)} ({_words(d.name)}).",
         "parameters": {"type": "dict", "properties": {p: dict(doc) for p, doc, _, _ in params}, "required": required}}
  for p, _, _, _ in params:
    if p not in required:
      doc["parameters"]["properties"][p]["description"] += " Optional."
  return {"doc": doc, "verb": verb, "thing": thing, "params": params, "domain": d.name}


def _call(fn: dict, rng) -> tuple[str, dict, str]:
  """(call text, ground truth {name: {param: [value]}}, request phrase) of one call of `fn`: its required params and
  each optional one with probability 1/2 (omitted ones may be left out: [""])."""
  required = set(fn["doc"]["parameters"]["required"])
  given, truth, phrases = [], {}, []
  for p, _, draw, phrase in fn["params"]:
    if p in required or rng.random() < 0.5:
      v = draw(rng)
      given.append(f"{p}={v!r}")
      truth[p] = [v]
      phrases.append(phrase(v))
    else:
      truth[p] = [""]
  name = fn["doc"]["name"]
  return f"{name}({', '.join(given)})", {name: truth}, _join(phrases)


def _join(phrases: list[str]) -> str:
  return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _opener(fn: dict, rng) -> str:
  t = str(rng.choice(OPENERS))
  return t.format(verb=fn["verb"], Verb=fn["verb"].capitalize(), thing=_words(fn["thing"]))


def example(kind: str, functions: list[dict], rng) -> dict:
  """One example of `kind` (KINDS) over `functions` (one domain's, at least 3 and all different): id, category
  (the BFCL category whose checker scores it), functions (docs offered), text (the request), target (the
  assistant's answer), ground_truth (None for irrelevance) and, for irrelevance, asked (the function the request
  is for, not offered)."""
  picks = [functions[i] for i in rng.permutation(len(functions))]
  if kind == "irrelevance":
    offered, other = picks[:2], picks[2]
    text = f"{_opener(other, rng)} {_call(other, rng)[2]}."
    target = str(rng.choice(REFUSALS)).format(verb=other["verb"], thing=_words(other["thing"]))
    return {"category": kind, "functions": [f["doc"] for f in offered], "text": text, "target": target,
            "ground_truth": None, "asked": other["doc"]["name"]}
  if kind == "simple":
    offered, called = picks[:1], picks[:1]
  elif kind == "multiple":
    offered = picks[:int(rng.integers(2, 4))]
    called = offered[:1]
    offered = [offered[i] for i in rng.permutation(len(offered))]
  elif kind == "parallel":
    offered, called = picks[:1], picks[:1] * 2
  else:
    offered, called = picks[:2], picks[:2]
  calls, truth, parts = [], [], []
  for i, fn in enumerate(called):
    c, t, phrase = _call(fn, rng)
    calls.append(c)
    truth.append(t)
    if i == 0:
      parts.append(f"{_opener(fn, rng)} {phrase}")
    else:
      second = str(rng.choice(SECOND)).format(verb=fn["verb"], thing=_words(fn["thing"]))
      parts.append(f"{second} {phrase}")
  return {"category": kind, "functions": [f["doc"] for f in offered], "text": ", ".join(parts) + ".",
          "target": f"[{', '.join(calls)}]", "ground_truth": truth}


def examples(domains, n: int, seed: int, forbidden: set[str], per_domain: int = 6, prefix: str = "sft") -> dict:
  """`n` examples over `per_domain` functions generated in each of `domains` (names never in `forbidden`; the
  drawn names are added to it), kinds drawn uniformly: {"functions": [docs], "examples": [...]}."""
  rng = np.random.default_rng(seed)
  by_domain = {d.name: [make_function(d, rng, forbidden) for _ in range(per_domain)] for d in domains}
  out = []
  for i in range(n):
    d = domains[int(rng.integers(len(domains)))]
    ex = example(str(rng.choice(KINDS)), by_domain[d.name], rng)
    out.append(dict(ex, id=f"{prefix}_{i}", domain=d.name))
  return {"functions": [f["doc"] for fs in by_domain.values() for f in fs], "examples": out}


def item(ex: dict) -> dict:
  """An example as `chat.request` and `chat.check` take an evaluation item."""
  return {"id": ex["id"], "category": ex["category"], "messages": [{"role": "user", "content": ex["text"]}],
          "functions": ex["functions"], "ground_truth": ex["ground_truth"], "text": ex["text"]}


def prompt_and_target(tok, ex: dict) -> tuple[list[int], list[int]]:
  """(prompt ids, target ids) of an example: the prompt exactly as the evaluation builds it (`chat.request`,
  `chat_ids`), the target the tokens the chat template puts after it for the assistant's answer, up to and
  including the end of turn (the tokenizer's eos)."""
  r = request(item(ex), ex["text"])
  prompt = chat_ids(tok, r["user"], r["system"], r["history"])
  msgs = [{"role": "system", "content": r["system"]}, *r["history"], {"role": "user", "content": r["user"]},
          {"role": "assistant", "content": ex["target"]}]
  full = tok.apply_chat_template(msgs, tokenize=True)
  if list(full[:len(prompt)]) != list(prompt):
    raise ValueError(f"{ex['id']}: the chat template renders the prompt differently once the answer follows")
  rest = list(full[len(prompt):])
  if tok.eos_id not in rest:
    raise ValueError(f"{ex['id']}: the chat template ends the assistant turn without the eos token {tok.eos_id}")
  return list(prompt), rest[:rest.index(tok.eos_id) + 1]


def sft_rows(tok, exs: list[dict], multiple: int = 32) -> dict:
  """inputs, targets, loss_mask [N, T] of the examples (`prompt_and_target`, right-padded; T the longest row
  rounded up to `multiple`), the loss on the target tokens only."""
  pairs = [prompt_and_target(tok, ex) for ex in exs]
  length = -(-max(len(p) + len(t) for p, t in pairs) // multiple) * multiple
  return sft_batch([p for p, _ in pairs], [t for _, t in pairs], length, pad_id=tok.batch_pad_id)


def lora_config(rank: int) -> lora.Config:
  return lora.Config(rank=rank, alpha=2.0 * rank, targets=LORA_TARGETS)


def optimizer(steps: int, lr: float) -> optax.GradientTransformation:
  """Adam at peak rate `lr`, cosine-decayed to a tenth over `steps`."""
  return optax.adam(optax.cosine_decay_schedule(lr, steps, 0.1))


def train_step(mcfg, lcfg: lora.Config, tx):
  """The jitted step: one optimizer step of the adapter on the completion-only loss, the frozen base riding in the
  batch as "base"."""
  sft_loss = losses.sft_loss_fn(mcfg)

  def loss_fn(adapter, batch, rng):
    rows = {k: v for k, v in batch.items() if k != "base"}
    return sft_loss(lora.merge(batch["base"], adapter, lcfg), rows, rng)
  return step_lib.jit_train_step(step_lib.make_train_step(loss_fn, tx))


def finetune(mcfg, params, rows: dict, steps: int, rank: int, lr: float, batch: int, seed: int,
             log=None) -> tuple[dict, list[float], dict]:
  """LoRA (`LORA_TARGETS`, alpha 2 * rank) trained for `steps` Adam steps (cosine decay) of `batch` rows; returns
  (merged params, per-step losses, the adapter)."""
  lcfg = lora_config(rank)
  tx = optimizer(steps, lr)
  step = train_step(mcfg, lcfg, tx)
  state = state_lib.create(lora.init(lcfg, params, jax.random.PRNGKey(seed + 5)), tx, seed)
  it = sft_batches(rows, min(batch, len(rows["inputs"])), seed + 1)
  hist = []
  for i in range(steps):
    t0 = time.time()
    state, m = step(state, dict(next(it), base=params))
    hist.append(float(m["loss"]))
    if log:
      log({"phase": "sft", "step": i, "loss": hist[-1], "seconds": time.time() - t0})
  return lora.merge(params, state.params, lcfg), hist, state.params


def heldout_accuracy(exs: list[dict], outputs: list[str]) -> dict:
  """Per held-out example, whether the evaluation's checker (`chat.check`) passes its output; {"accuracy",
  "accuracy.<kind>", "rows"}."""
  rows = [{"id": ex["id"], "category": ex["category"], "text": ex["text"], "target": ex["target"], "output": o,
           "valid": bool(check(item(ex), o).valid)} for ex, o in zip(exs, outputs, strict=True)]
  out = {"accuracy": float(np.mean([r["valid"] for r in rows])), "rows": rows}
  for k in KINDS:
    vs = [r["valid"] for r in rows if r["category"] == k]
    if vs:
      out[f"accuracy.{k}"] = float(np.mean(vs))
  return out


def bfcl_names(categories) -> set[str]:
  """The names of every function in the BFCL question files of `categories` (keys of `CATEGORIES`)."""
  from experiments.bfcl_audio import CATEGORIES, bfcl
  return {f["name"] for c in categories for q in bfcl.load(CATEGORIES[c])[0] for f in q["function"]}


def fitting(tok, exs: list[dict], n: int, max_tokens: int, what: str) -> list[dict]:
  """The first `n` examples whose prompt and target take at most `max_tokens` tokens."""
  out = [ex for ex in exs if sum(map(len, prompt_and_target(tok, ex))) <= max_tokens][:n]
  if len(out) < n:
    raise ValueError(f"only {len(out)} of {len(exs)} generated {what} examples fit sft_max_tokens={max_tokens}; "
                     f"expected {n}: raise sft_max_tokens")
  return out


def prepare(cfg, tok, forbidden: set[str]) -> dict:
  """The SFT's data at `cfg` (sft_* fields): training examples over the training domains and held-out ones over the
  held-out domains, no function named as one of `forbidden` or as another; {"train", "heldout": examples,
  "train_functions", "heldout_functions": docs}."""
  taken = set(forbidden)
  train_domains, heldout_domains = split_domains()
  train = examples(train_domains, 2 * cfg.sft_examples, cfg.sft_seed, taken, prefix="sft_train")
  heldout = examples(heldout_domains, 2 * cfg.sft_heldout, cfg.sft_seed + 1, taken, prefix="sft_heldout")
  return {"train": fitting(tok, train["examples"], cfg.sft_examples, cfg.sft_max_tokens, "training"),
          "heldout": fitting(tok, heldout["examples"], cfg.sft_heldout, cfg.sft_max_tokens, "held-out"),
          "train_functions": train["functions"], "heldout_functions": heldout["functions"]}


def tune(cfg, loaded, data: dict, generate_with, log=None) -> tuple[dict, dict, list[dict]]:
  """Trains the adapter on data["train"] and merges it (`finetune`), then answers the held-out requests with
  `generate_with(params)(requests)` and scores them; returns (merged params, results, held-out rows)."""
  mcfg, params, tok = loaded
  t0 = time.time()
  rows = sft_rows(tok, data["train"])
  merged, hist, _ = finetune(mcfg, params, rows, cfg.sft_steps, cfg.sft_rank, cfg.sft_lr, cfg.sft_batch,
                             cfg.sft_seed, log)
  seconds = time.time() - t0
  outputs = generate_with(merged)([request(item(ex), ex["text"]) for ex in data["heldout"]])
  scored = heldout_accuracy(data["heldout"], outputs)
  k = max(1, len(hist) // 10)
  res = {"sft.examples": len(data["train"]), "sft.heldout_examples": len(data["heldout"]),
         "sft.heldout_accuracy": scored["accuracy"], "sft.loss_first": float(np.mean(hist[:k])),
         "sft.loss_last": float(np.mean(hist[-k:])), "sft.seconds": seconds}
  res.update({f"sft.heldout_{key}": v for key, v in scored.items() if key.startswith("accuracy.")})
  return merged, res, scored["rows"]


def main(argv=None) -> dict:
  """The SFT alone at a preset (`python -m experiments.bfcl_audio.call_sft --preset cpu [--set k=v ...]`): prepares
  the data against the preset's BFCL categories, trains, scores the held-out functions and prints the results."""
  import argparse
  import json
  from experiments import registry
  from experiments.bfcl_audio import PRESETS
  from experiments._shared.chat_models import load_chat_model
  ap = argparse.ArgumentParser(description=main.__doc__)
  ap.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
  ap.add_argument("--set", action="append", default=[], help="a Config field, k=v, as `experiments run` takes it")
  args = ap.parse_args(argv)
  cfg = registry.config_for("bfcl_audio", args.preset, args.set)
  if cfg.sft_steps < 1:
    raise SystemExit(f"sft_steps is {cfg.sft_steps} at preset {args.preset!r}: pass --set sft_steps=N")
  t0 = time.time()
  mcfg, params, tok = load_chat_model(cfg.model, cfg.dtype, cfg.dtype)
  data = prepare(cfg, tok, bfcl_names(cfg.categories))
  _, res, rows = tune(cfg, (mcfg, params, tok), data, lambda p: chat_generator(
      cfg.model, cfg.max_new_tokens, cfg.batch_size, loaded=(mcfg, p, tok)), log=lambda r: print(r, flush=True))
  for r in rows:
    print(json.dumps({k: r[k] for k in ("category", "valid", "target", "output")}), flush=True)
  res["wall_seconds"] = time.time() - t0
  print(json.dumps(res, indent=1), flush=True)
  return res


if __name__ == "__main__":
  main()
