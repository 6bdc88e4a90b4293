"""The run of tele_lens: what `python -m experiments run tele_lens` executes (its Config, presets and claims are in
`experiments/tele_lens/__init__.py`, the paper and its departures in `experiments/tele_lens/README.md`)."""
from __future__ import annotations

import collections
import functools
import json
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from experiments import registry
from experiments._shared.chat_models import chat_ids, load_chat_model, resolve_model, stop_tokens
from jaxlab import sharding as shd
from experiments.runner import plan as plan_lib
from jaxlab.data.tasks import reasoning
from jaxlab.generate import sample, sampling
from jaxlab.hf import hub
from jaxlab.interp import probes
from jaxlab.models import transformer as tfm
from experiments.tele_lens import ANSWER_RE, Config, INSTRUCTION


EXTRACT_BATCH = 8  # rows per hidden-state extraction batch (`probes.extract`'s default)
READOUT_BATCH = 8  # rows per LM read-out batch (`_lm_readouts`)
# Token widths `plan` assumes, which depend on the model's tokenizer and its CoTs (neither read by `plan`): the
# chat-formatted questions (at most 310 characters, under a system turn) and a full row (prompt, a CoT of
# max_cot_tokens, "\nAnswer:" and the answer) padded to a multiple of 32, the longest a batch can be.
PLAN_PROMPT_WIDTH = 160
PLAN_VOCAB_SUBSET = 8192  # the CoTs' distinct target tokens (the token probe's read-out columns)


def questions(cfg: Config) -> list[reasoning.Example]:
  """`examples` problems per task: generated (balanced over the task's answers, deterministic in `seed`), or the
  first `examples` rows of each task of `task_file`."""
  if cfg.task_file:
    return read_tasks(cfg.task_file, cfg.examples, need_cot=cfg.cot == "template")
  return [ex for task in cfg.tasks for ex in (reasoning.generate(task, cfg.examples, seed=cfg.seed)
                                              if task in reasoning.TASKS else
                                              reasoning.from_gym(task, cfg.examples, seed=cfg.seed))]


def read_tasks(path: str, per_task: int, need_cot: bool = False) -> list[reasoning.Example]:
  """Questions from a JSONL file, one {"question", "answer", "task" (optional), "cot" (optional, one step per
  line)} object per line; the first `per_task` of each task, grouped by task in order of first appearance."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"task_file {path!r} does not exist (expected JSONL with question and answer fields)")
  by_task: dict[str, list] = {}
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
      missing = [k for k in ("question", "answer") + (("cot",) if need_cot else ()) if not isinstance(row.get(k), str)]
      if missing:
        raise ValueError(f"{path}:{n}: expected string fields {missing}, found keys {sorted(row)}")
      task = str(row.get("task", "file"))
      cot = tuple(row.get("cot", "").split("\n")) if row.get("cot") else ()
      by_task.setdefault(task, []).append(reasoning.Example(task, row["question"], cot, row["answer"], ()))
  if not by_task:
    raise ValueError(f"{path}: no questions")
  return [ex for rows in by_task.values() for ex in rows[:per_task]]


def answer_words(exs) -> dict[str, tuple[str, ...]]:
  """Each task's answer words: the registry's for generated tasks, the answers that occur for a file's."""
  out = {}
  for ex in exs:
    if ex.task in reasoning.TASKS:
      out[ex.task] = reasoning.TASKS[ex.task].answers
    elif ex.task in reasoning.GYM_TASKS:
      out[ex.task] = reasoning.GYM_TASKS[ex.task]
    else:
      out[ex.task] = tuple(sorted(set(out.get(ex.task, ())) | {ex.answer}))
  return out


def splits(exs) -> list[str]:
  """"train" for the first half of each task's distinct questions, "test" for the rest; a question drawn again (same
  task and text) goes where it first went, so the test questions are never training ones."""
  distinct = dict.fromkeys((ex.task, ex.prompt) for ex in exs)
  count, seen, where = collections.Counter(task for task, _ in distinct), collections.Counter(), {}
  for task, q in distinct:
    seen[task] += 1
    where[task, q] = "train" if seen[task] <= count[task] // 2 else "test"
  return [where[ex.task, ex.prompt] for ex in exs]


def record_splits(out_dir: str, exs) -> dict:
  """Records the probes' training questions (`train`) and their test questions (`test`), as `splits` assigns them."""
  from experiments.runner import splits as splits_lib
  where = splits(exs)
  return splits_lib.record(out_dir, "tele_lens", {s: {"questions": [ex.prompt for ex, w in zip(exs, where) if w == s]}
                                                  for s in ("train", "test")})


def prompt_ids(tok, ex: reasoning.Example) -> list[int]:
  return chat_ids(tok, ex.prompt + INSTRUCTION)


def split_cot(text: str, answers) -> tuple[str, str | None]:
  """(the CoT before the model states its answer, the first of `answers` it states after, or None)."""
  m = ANSWER_RE.search(text)
  if m is None:
    return text.strip(), None
  said = re.search(r"(?i)\b(" + "|".join(map(re.escape, answers)) + r")\b", text[m.end():])
  return text[:m.start()].strip(), (next(a for a in answers if a.lower() == said.group(1).lower()) if said else None)


def model_cots(cfg: Config, params, mcfg: tfm.Config, tok, exs) -> list[list[dict]]:
  """Per question: the model's greedy CoT, then `sampled_cots` sampled ones, each {"kind", "text" (the generation),
  "cot" (cut before the stated answer), "stated" (that answer or None)}; every batch has the same shape (rows
  padded with the last prompt, prompts left-padded to the longest), so each decoding mode compiles once."""
  prompts = [prompt_ids(tok, ex) for ex in exs]
  width = max(len(p) for p in prompts)
  stops = stop_tokens(mcfg, tok)
  kinds = [("greedy", 0.0)] + [("sampled", cfg.temperature)] * cfg.sampled_cots
  out, words = [[] for _ in exs], answer_words(exs)
  key = jax.random.key(cfg.seed)
  for j, (kind, temp) in enumerate(kinds):
    for i in range(0, len(prompts), cfg.generate_batch):
      part = prompts[i:i + cfg.generate_batch]
      part = part + [part[-1]] * (cfg.generate_batch - len(part))
      toks = np.full((len(part), width), tok.batch_pad_id, np.int32)
      mask = np.zeros((len(part), width), np.int32)
      for b, p in enumerate(part):
        toks[b, width - len(p):], mask[b, width - len(p):] = p, 1
      res = sample(params, mcfg, toks, cfg.max_cot_tokens, prompt_mask=mask, temperature=temp,
                   key=jax.random.fold_in(key, j * 100003 + i), stop_tokens=stops, pad_id=tok.batch_pad_id)
      new, lengths = np.asarray(res.tokens), np.asarray(res.lengths)
      for b in range(min(cfg.generate_batch, len(prompts) - i)):
        ex = exs[i + b]
        text = tok.decode([int(t) for t in new[b, :lengths[b]] if int(t) not in stops])
        cot, stated = split_cot(text, words[ex.task])
        out[i + b].append({"kind": kind, "text": text, "cot": cot, "stated": stated})
  return out


def build(cfg: Config, tok, exs, cots: list[list[dict]] | None = None) -> list[dict]:
  """Rows with token ids: prompt, CoT, "\nAnswer:" and the one-token gold answer, and where each part starts;
  one row per non-empty CoT of the questions `exs` (the template's, or each of `cots[q]`, the model's CoTs of
  question q)."""
  if (cfg.cot == "model") != (cots is not None) or (cots is not None and len(cots) != len(exs)):
    raise ValueError(f"cot={cfg.cot!r} needs {'one list of CoTs per question' if cfg.cot == 'model' else 'no cots'}"
                     f" ({len(exs)} questions), found {None if cots is None else len(cots)}")
  rows, words, split = [], answer_words(exs), splits(exs)
  for q, ex in enumerate(exs):
    prompt = prompt_ids(tok, ex)
    slot = tok.encode("\nAnswer:")
    ans = tok.encode(" " + ex.answer)
    if len(ans) != 1:
      raise ValueError(f"answer {ex.answer!r} is {len(ans)} tokens; the answer probe reads one token")
    choices = sorted({tok.encode(" " + a)[0] for a in words[ex.task]})
    for c in ([{"kind": "template", "cot": ex.cot, "stated": None}] if cots is None else cots[q]):
      if not c["cot"]:
        continue  # answered at once: no CoT to probe
      cot = tok.encode(c["cot"])
      ids = prompt + cot + slot + ans
      rows.append({"task": ex.task, "question": q, "kind": c["kind"], "stated": c["stated"],
                   "gold": ex.answer, "split": split[q],
                   "ids": ids, "cot_start": len(prompt), "cot_end": len(prompt) + len(cot),
                   "slot": len(ids) - 2, "answer": ans[0], "choices": choices})
  return rows


@functools.lru_cache(maxsize=8)
def readout_fn(mcfg: tfm.Config, answer_ids: tuple[int, ...]):
  """The jitted LM read-out of `_lm_readouts`: `(params, tokens_BT, mask_BT)` -> (self-certainty [B, T], log-prob
  of the next token [B, T - 1], answer-word logits [B, T, A], next-token entropy [B, T]); weights are an argument,
  not constants folded into the program."""
  ids = np.asarray(answer_ids, np.int32)

  @jax.jit
  def fn(params, tokens_BT, mask_BT):
    logits = tfm.forward(params, tokens_BT, mcfg, attention_mask_BT=mask_BT).logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, -1)
    sc = -jnp.mean(logp, -1) - jnp.log(logp.shape[-1])
    nxt = jnp.take_along_axis(logp[:, :-1], tokens_BT[:, 1:, None], -1)[..., 0]
    return sc, nxt, logits[..., ids], -jnp.sum(jnp.exp(logp) * logp, -1)
  return fn


def probe_config(cfg: Config, mcfg: tfm.Config) -> probes.Config:
  return probes.Config(d_model=mcfg.d_model, rank=cfg.rank, alpha=cfg.alpha, horizon=cfg.horizon,
                       learning_rate=cfg.learning_rate, activation=cfg.probe_activation, schedule=cfg.probe_schedule)


def _lm_readouts(params, mcfg: tfm.Config, rows, answer_ids, batch: int = READOUT_BATCH):
  """Per row: self-certainty, log-prob of the next CoT token and next-token entropy at each position, and the
  answer-word logits at the answer slot (a plain forward; full-vocabulary logits never leave the device)."""
  fn = readout_fn(mcfg, tuple(int(a) for a in answer_ids))
  out = []
  for i in range(0, len(rows), batch):
    part = rows[i:i + batch]
    t = -(-max(len(r["ids"]) for r in part) // 32) * 32
    tok = np.zeros((batch, t), np.int32)
    mask = np.zeros((batch, t), np.int32)
    for b, r in enumerate(part):
      tok[b, :len(r["ids"])], mask[b, :len(r["ids"])] = r["ids"], 1
    sc, nxt, ans, ent = (np.asarray(x) for x in fn(params, tok, mask))
    for b, r in enumerate(part):
      out.append({"sc": sc[b], "next_logprob": nxt[b], "answer_logits": ans[b, r["slot"]], "entropy": ent[b]})
  return out


def cached_cots(cfg: Config, out_dir: str, params, mcfg: tfm.Config, tok, exs) -> list[list[dict]]:
  """`model_cots`, read from out_dir/cots.json when a run of this config wrote it, else generated and written."""
  path = os.path.join(out_dir, "cots.json")
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  cots = model_cots(cfg, params, mcfg, tok, exs)
  with open(path + ".tmp", "w") as f:
    json.dump(cots, f, indent=1)
  os.replace(path + ".tmp", path)
  return cots


def run_with_model(cfg: Config, out_dir: str, mcfg: tfm.Config, params, tok, model_name: str, exs=None) -> dict:
  """The experiment on a loaded model; `exs` the questions when already read (default `questions(cfg)`)."""
  if cfg.layers[-1] > mcfg.n_layers:
    raise ValueError(f"layers must be <= the model's {mcfg.n_layers} layers, found {cfg.layers}")
  exs = questions(cfg) if exs is None else exs
  record_splits(out_dir, exs)
  rows = build(cfg, tok, exs, cached_cots(cfg, out_dir, params, mcfg, tok, exs) if cfg.cot == "model" else None)
  seqs = [r["ids"] for r in rows]
  # CoT positions: from the token before the CoT (it predicts the CoT's first token) to the last CoT token
  pos = np.array([(i, t) for i, r in enumerate(rows) for t in range(r["cot_start"] - 1, r["cot_end"])])
  train = np.array([rows[i]["split"] == "train" for i in pos[:, 0]])
  ends = [r["cot_end"] for r in rows]
  tok_targets = probes.token_targets(seqs, pos, cfg.horizon, ends=ends)
  vocab = np.unique(np.concatenate([tok_targets[tok_targets >= 0], [r["answer"] for r in rows]]))
  y_tokens = probes.to_subset(tok_targets, vocab)
  answer_ids = sorted({a for r in rows for a in r["choices"]})
  y_answer = probes.to_subset([rows[i]["answer"] for i in pos[:, 0]], answer_ids)
  head_tokens, head_answer = probes.lm_head(params, vocab), probes.lm_head(params, answer_ids)
  base = probe_config(cfg, mcfg)
  cache = os.path.join(out_dir, "features")
  res, answer_probs = {}, {}
  records = []
  for layer in cfg.layers:
    h = probes.extract_cached(cache, model_name, params, mcfg, seqs, layer, pos)
    pc = base.replace(kind="tokens")
    p, losses = probes.train(pc, h[train], y_tokens[train], head_DV=head_tokens, epochs=cfg.epochs,
                             batch_size=cfg.batch_size, seed=cfg.seed)
    top5 = probes.topk_accuracy(probes.predict(p, pc, h[~train], head_tokens), y_tokens[~train], k=5)
    for d in range(1, cfg.horizon + 1):
      res[f"horizon.top5.layer{layer}.d{d}"] = float(top5[d - 1])
    if cfg.full_vocab_positions and layer == cfg.uncertainty_layer:
      res.update(_full_vocab_check(cfg, p, pc, params, h, ~train, tok_targets, y_tokens, head_tokens, layer))
    pa = base.replace(kind="answer")
    p, losses_a = probes.train(pa, h[train], y_answer[train], head_DV=head_answer, epochs=cfg.epochs,
                               batch_size=cfg.batch_size, seed=cfg.seed)
    logits = probes.predict(p, pa, h, head_answer)
    res[f"final_answer_acc.layer{layer}"] = float(np.mean(logits[~train].argmax(-1) == y_answer[~train]))
    answer_probs[layer] = logits
    records.append({"layer": layer, "token_probe_loss": losses[-1], "answer_probe_loss": losses_a[-1],
                    "top5": [float(v) for v in top5]})
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  for d in range(1, cfg.horizon + 1):
    res[f"horizon.top5.mean.d{d}"] = float(np.nanmean([res[f"horizon.top5.layer{l}.d{d}"] for l in cfg.layers]))

  # uncertainty and bypass on the test half
  lm = _lm_readouts(params, mcfg, rows, answer_ids)
  ent = np.asarray(probes.entropy(answer_probs[cfg.uncertainty_layer]))
  pred_probe = np.asarray(answer_ids)[answer_probs[cfg.uncertainty_layer].argmax(-1)]
  test = [i for i, r in enumerate(rows) if r["split"] == "test"]
  correct, pivot, high, sc, ppl, bypassed, bypass_right = [], [], [], [], [], [], []
  for i in test:
    r, here = rows[i], pos[:, 0] == i
    cols = [answer_ids.index(a) for a in r["choices"]]
    lm_answer = r["choices"][int(np.argmax(lm[i]["answer_logits"][cols]))]
    correct.append(lm_answer == r["answer"])
    every = np.ones((1, here.sum()), bool)
    pivot.append(float(probes.pivot_uncertainty(ent[here][None], every, cfg.pivot_k)[0]))
    cot = slice(r["cot_start"] - 1, r["cot_end"] - 1)  # positions whose next token is a CoT token
    lm_ent = lm[i]["entropy"][cot][None]
    high.append(float(probes.pivot_uncertainty(lm_ent, np.ones_like(lm_ent, bool), cfg.pivot_k, highest=True)[0]))
    sc.append(float(np.mean(lm[i]["sc"][cot])))
    ppl.append(float(np.exp(-np.mean(lm[i]["next_logprob"][cot]))))
    at = bypass_at(cfg, ent[here])
    bypassed.append(at is not None)
    bypass_right.append(bool(pred_probe[here][at] == r["answer"]) if at is not None else correct[-1])
  correct = np.asarray(correct)
  both = 0 < correct.sum() < len(correct)
  res["auroc.pivot"] = probes.auroc(-np.asarray(pivot), correct) if both else float("nan")
  res["auroc.topk_highest"] = probes.auroc(-np.asarray(high), correct) if both else float("nan")
  res["auroc.self_certainty"] = probes.auroc(np.asarray(sc), correct) if both else float("nan")
  res["auroc.perplexity"] = probes.auroc(-np.asarray(ppl), correct) if both else float("nan")
  res["bypass.rate"] = float(np.mean(bypassed))
  res["bypass.accuracy_change"] = float(np.mean(bypass_right) - np.mean(correct))
  res["lm_answer_acc"] = float(np.mean(correct))
  res["cot.mean_tokens"] = float(np.mean([r["cot_end"] - r["cot_start"] for r in rows]))
  stated = [r for r in rows if r["stated"] is not None]
  res["cot.stated_rate"] = len(stated) / len(rows) if cfg.cot == "model" else float("nan")
  res["cot.stated_acc"] = float(np.mean([r["stated"] == r["gold"] for r in stated])) if stated else float("nan")
  res["positions"], res["vocab_subset"] = int(len(pos)), int(len(vocab))
  ds = list(range(1, cfg.horizon + 1))
  registry.plot_curves(os.path.join(out_dir, "horizon.png"),
                       {f"layer {l}": (ds, [res[f"horizon.top5.layer{l}.d{d}"] for d in ds]) for l in cfg.layers},
                       title="tele_lens: probe top-5 accuracy by distance ahead", xlabel="delta (tokens ahead)",
                       ylabel="top-5 accuracy")
  return res


def bypass_at(cfg: Config, entropy_T) -> int | None:
  """The first of a CoT's first `bypass_window` positions whose answer-probe entropy / log(`entropy_norm`) is below
  `bypass_threshold` (where the CoT is bypassed), or None."""
  early = np.flatnonzero(np.asarray(entropy_T)[:cfg.bypass_window] / np.log(cfg.entropy_norm) < cfg.bypass_threshold)
  return int(early[0]) if len(early) else None


def _full_vocab_check(cfg: Config, p, pc, params, h, test, tok_targets, y_tokens, head_tokens, layer) -> dict:
  """The token probe (trained on the CoTs' vocabulary subset) read out through the whole LM head, on up to
  `full_vocab_positions` evenly spaced test positions, beside its subset top-5 on the same positions: how much the
  subset makes top-5 easier."""
  at = np.flatnonzero(test)
  at = at[np.unique(np.linspace(0, len(at) - 1, min(cfg.full_vocab_positions, len(at))).astype(int))]
  full = probes.topk_accuracy(None, tok_targets[at], 5,
                              top_ids=probes.predict(p, pc, h[at], probes.lm_head(params), top_k=5))
  sub = probes.topk_accuracy(probes.predict(p, pc, h[at], head_tokens), y_tokens[at], 5)
  out = {"full_vocab.layer": layer, "full_vocab.positions": int(len(at))}
  for d in range(1, cfg.horizon + 1):
    out[f"full_vocab.top5.d{d}"], out[f"full_vocab.subset_top5.d{d}"] = float(full[d - 1]), float(sub[d - 1])
  return out


def model_ref(spec: str) -> str:
  """What `jaxlab.hf.hub` reads a model's architecture from: a repo id as given, else the model's path."""
  return spec if hub.is_repo_id(spec) else resolve_model(spec)


def workloads(cfg: Config, mesh) -> list[plan_lib.Workload]:
  """The LM's CoT generation (greedy, then sampled; `cot="model"`), the hidden-state extraction forward (once per
  probed layer), the LM read-out forward and the probes' train step (token and answer probes, every layer), with
  abstract arguments at the preset's shapes (`experiments plan`). The LM's weights are replicated, as the run holds
  them on one device; rows are split over the mesh's batch axes. Widths are upper bounds (`PLAN_PROMPT_WIDTH`, a
  full CoT), step counts those of `examples` questions per task, each CoT a full `max_cot_tokens` long."""
  mcfg = hub.config(model_ref(cfg.model), dtype=cfg.dtype)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  rep = lambda tree: jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), tree)
  params = rep(jax.eval_shape(lambda: tfm.init(mcfg, jax.random.key(0))))
  n_q = cfg.examples * (1 if cfg.task_file else len(cfg.tasks))
  cots = n_q * (1 + cfg.sampled_cots) if cfg.cot == "model" else n_q
  fwd = lambda b, t: tfm.flops_per_token(mcfg, t) / 3 * b * t  # 2·N·tokens (+ attention)
  out = []
  if cfg.cot == "model":
    b, t, new = cfg.generate_batch, PLAN_PROMPT_WIDTH, cfg.max_cot_tokens
    rows = shd.abstract_rows({"tokens": ((b, t), "int32"), "mask": ((b, t), "int32")}, mesh)
    scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype, sharding=replicated)
    key = scalar(jax.random.key(0).dtype)
    for kind, greedy, calls in (("greedy", True, 1), ("sampled", False, cfg.sampled_cots)):
      if not calls:
        continue
      fn = jax.jit(functools.partial(
          sampling._generate, cfg=mcfg, max_new=new, greedy=greedy, top_k=None, use_top_p=False,
          stop=(mcfg.eos_token_id,) if isinstance(mcfg.eos_token_id, int) else tuple(mcfg.eos_token_id or ()),
          forward_fn=sampling.layer_list_forward, init_cache_fn=sampling.layer_list_cache, return_logits=False,
          return_logprobs=False, unrolled=True))
      args = (params, rows["tokens"], rows["mask"], None, key, scalar(jnp.float32), scalar(jnp.float32),
              scalar(jnp.int32), scalar(jnp.int32))
      flops = fwd(b, t) + sum(fwd(b, 1) + 4 * mcfg.n_layers * mcfg.n_heads * mcfg.kdim * b * (t + i)
                              for i in range(1, new))
      out.append(plan_lib.Workload(f"generate.{kind}", "generate", fn, args, math.ceil(n_q / b) * calls, flops,
                                   loop_trips=new - 1))
  width = -(-(PLAN_PROMPT_WIDTH + cfg.max_cot_tokens + 4) // 32) * 32
  shape = (EXTRACT_BATCH, width)
  rows = shd.abstract_rows({"tokens": (shape, "int32"), "mask": (shape, "int32")}, mesh)
  program = jax.ShapeDtypeStruct((mcfg.n_layers,), jnp.int32, sharding=replicated)
  depth = sum(cfg.layers) / len(cfg.layers) / mcfg.n_layers  # the truncated programs run the first `layer` layers
  out.append(plan_lib.Workload("extract_hidden", "forward", probes._hidden_fn(mcfg),
                               (params, rows["tokens"], rows["mask"], program),
                               math.ceil(cots / EXTRACT_BATCH) * len(cfg.layers), fwd(EXTRACT_BATCH, width) * depth))
  words = [reasoning.TASKS[t].answers if t in reasoning.TASKS else reasoning.GYM_TASKS[t] for t in cfg.tasks]
  answers = tuple(range(len({w for ws in words for w in ws})))  # the tasks' answer words (a task file's: as many)
  shape = (READOUT_BATCH, width)
  rows = shd.abstract_rows({"tokens": (shape, "int32"), "mask": (shape, "int32")}, mesh)
  out.append(plan_lib.Workload("lm_readout", "forward", readout_fn(mcfg, answers), (params, rows["tokens"],
                               rows["mask"]), math.ceil(cots / READOUT_BATCH), fwd(READOUT_BATCH, width)))
  positions = cots * (cfg.max_cot_tokens + 1)
  steps = cfg.epochs * math.ceil(positions / 2 / cfg.batch_size) * len(cfg.layers)
  for kind, cols, y in (("tokens", PLAN_VOCAB_SUBSET, (cfg.batch_size, cfg.horizon)),
                        ("answer", len(answers), (cfg.batch_size,))):
    pc = probe_config(cfg, mcfg).replace(kind=kind, decay_steps=steps // len(cfg.layers))
    tx = probes.optimizer(pc)  # what `probes.train` builds its (cached) step with
    p = rep(jax.eval_shape(lambda pc=pc: probes.init(pc, jax.random.key(0))))
    batch = shd.abstract_rows({"h": ((cfg.batch_size, mcfg.d_model), "float32"), "y": (y, "int32"),
                               "w": ((cfg.batch_size,), "float32")}, mesh)
    head = jax.ShapeDtypeStruct((mcfg.d_model, cols), jnp.float32, sharding=replicated)
    m = cfg.horizon if kind == "tokens" else 1
    flops = 6.0 * cfg.batch_size * m * (2 * mcfg.d_model * cfg.rank) + 4.0 * cfg.batch_size * m * mcfg.d_model * cols
    out.append(plan_lib.Workload(f"probe_train_step.{kind}", "train", probes._train_step(pc),
                                 (p, rep(jax.eval_shape(tx.init, p)), batch, head), steps, flops))
  return out


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # features are cached under out_dir; probes retrain in minutes
  exs = questions(cfg)  # a bad task_file fails here, before the model loads
  mcfg, params, tok = load_chat_model(cfg.model, cfg.dtype)
  return run_with_model(cfg, out_dir, mcfg, params, tok, cfg.model, exs)
