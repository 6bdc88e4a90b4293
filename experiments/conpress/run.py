"""The run of conpress: what `python -m experiments run conpress` executes (its Config, presets and claims are in
`experiments/conpress/__init__.py`, the paper and its departures in `experiments/conpress/README.md`)."""
from __future__ import annotations

import functools
import json
import os
import time

import jax
import numpy as np
import optax

from experiments import registry
from experiments._shared.adapters import sft_batches
from experiments._shared.chat_models import abstract_params, chat_ids, load_chat_model, stop_tokens
from experiments._shared import recipes
from experiments.conpress.parsing import Parsed, parse_packed, sft_completion  # noqa: F401  (public here too)
from experiments.conpress.parsing import equivalent
from experiments.runner import splits
from jaxlab import losses
from jaxlab import sharding as shd
from jaxlab.adapters import lora
from jaxlab.data.tasks import arithmetic
from jaxlab.generate import sample
from jaxlab.models import transformer as tfm
from jaxlab.rl.dpo import sft_batch
from jaxlab.train import loop as loop_lib
from jaxlab.train import state as state_lib
from experiments.conpress import Config, HEAD


def pack_prompt(questions) -> str:
  """The fixed multi-question format (module docstring); N = 1 is the same format with one problem."""
  what = "problem" if len(questions) == 1 else f"{len(questions)} problems"
  return HEAD.format(what=what) + "\n\n" + "\n".join(f"Problem {i + 1}: {q}" for i, q in enumerate(questions))


def read_jsonl(path: str, n: int, exclude=frozenset()) -> list[dict]:
  """The first `n` {"question", "answer"} rows of a JSONL file whose question (`splits.canonical`) is not in
  `exclude`: the question from "question" / "problem" / "prompt", the answer from "answer" (GSM8K's text after
  "####"; MATH500 / AIME answers as they are)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"expected a JSONL question file, found nothing at {path!r}")
  rows = []
  with open(path, encoding="utf-8") as f:
    for line_no, line in enumerate(f, 1):
      if not line.strip():
        continue
      d = json.loads(line)
      q = next((d[k] for k in ("question", "problem", "prompt") if k in d), None)
      if q is None or "answer" not in d:
        raise ValueError(f"{path}:{line_no}: expected a question/problem/prompt and an answer field, found "
                         f"{sorted(d)}")
      if splits.canonical(str(q)) in exclude:
        continue
      rows.append({"question": str(q), "answer": str(d["answer"]).rsplit("####", 1)[-1].strip()})
      if len(rows) == n:
        return rows
  raise ValueError(f"{path}: expected at least {n} questions, found {len(rows)}")


class Task:
  """Questions with gold answers and a scorer: reasoning-gym's `score_answer`, or `equivalent` (string, then
  math-verify) for JSONL. None of its questions (`splits.canonical`) is in `exclude` (another split's)."""

  def __init__(self, spec: str, n: int, seed: int, terms, digits, exclude=frozenset()):
    if spec.startswith("jsonl:"):
      self.dataset, self.entries = None, read_jsonl(spec[len("jsonl:"):], n, exclude)
      return
    import reasoning_gym  # an experiment dependency, imported where it is used
    kw = dict(min_terms=terms[0], max_terms=terms[1], min_digits=digits[0], max_digits=digits[1]) \
        if spec in ("chain_sum", "basic_arithmetic") else {}
    if spec == "basic_arithmetic":  # sums and differences of non-negative numbers
      kw.update(operators=("+", "-"), allow_parentheses=False, allow_negation=False)
    size = n
    while True:  # a larger dataset until n of its questions are not excluded
      try:
        self.dataset = reasoning_gym.create_dataset(spec, size=size, seed=seed, **kw)
      except Exception as e:  # noqa: BLE001  (an unknown name or bad settings: one line)
        raise ValueError(f"task {spec!r}: expected a reasoning-gym dataset or 'jsonl:PATH', found "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
      self.entries = [e for e in self.dataset if splits.canonical(e["question"]) not in exclude][:n]
      if len(self.entries) == n:
        break
      if size >= 64 * n:
        raise ValueError(f"task {spec!r}: fewer than {n} of {size} questions are not in the other split; widen "
                         f"its ranges (terms, digits) or ask for fewer")
      size *= 2

  def correct(self, answer: str | None, entry: dict) -> bool:
    if answer is None:
      return False
    gold = arithmetic.normalize(str(entry["answer"]))
    if arithmetic.NUMBER.fullmatch(gold):  # a numeric gold: the first number after the answer's last "="
      m = arithmetic.NUMBER.search(answer.rsplit("=", 1)[-1])
      answer = m.group(0) if m else answer
    if self.dataset is not None:
      return float(self.dataset.score_answer(answer=arithmetic.normalize(answer), entry=entry)) >= 1.0
    return equivalent(answer, str(entry["answer"]))


def generate(params, mcfg, tok, prompts: list[list[int]], budgets: list[int], gen_batch: int,
             one_shape: tuple[int, int] | None = None):
  """Greedy completions of token-list prompts, each with its own new-token budget.

  By default rows are grouped by budget and run `gen_batch` at a time (a smaller group padded to a multiple of 4
  rows), left-padded to a multiple of 64 positions. With `one_shape=(t, m)` every chunk is `gen_batch` rows of `t`
  positions decoded for `m` tokens and each row is cut at its budget afterwards (greedy rows are independent, so
  the cut equals decoding with that budget): one compiled program for the whole run.

  Returns:
    (texts, token counts): a count is the row's completion-mask sum (generated tokens, the stop token included).
  """
  stops = stop_tokens(mcfg, tok)
  pad = tok.batch_pad_id
  texts, counts = [None] * len(prompts), np.zeros(len(prompts), np.int64)
  groups = [list(range(len(prompts)))] if one_shape else \
      [[i for i, b in enumerate(budgets) if b == budget] for budget in sorted(set(budgets))]
  for idx in groups:
    for s in range(0, len(idx), gen_batch):
      chunk = idx[s:s + gen_batch]
      cap = max(len(prompts[i]) + budgets[i] for i in chunk)  # decoding stops once every row passed its budget
      if one_shape:
        b, (t, m) = gen_batch, one_shape
      else:
        b = chunk_rows(len(idx), len(chunk), gen_batch)
        t, m = -(-max(len(prompts[i]) for i in chunk) // 64) * 64, budgets[chunk[0]]
      ids, mask = np.full((b, t), pad, np.int32), np.zeros((b, t), np.int32)
      for r, i in enumerate(chunk + [chunk[0]] * (b - len(chunk))):
        ids[r, t - len(prompts[i]):], mask[r, t - len(prompts[i]):] = prompts[i], 1
      if one_shape:
        out = sample(params, mcfg, ids, m, prompt_mask=mask, stop_tokens=stops, pad_id=pad, max_length=cap)
      else:  # rows of one budget: the cap stops none of them before `m` new tokens
        out = generate_step(mcfg, m, stops, pad)(params, ids, mask)
      toks, comp = np.asarray(out.tokens), np.asarray(out.completion_mask)
      for r, i in enumerate(chunk):
        counts[i] = min(int(comp[r].sum()), budgets[i])
        texts[i] = tok.decode(toks[r, :counts[i]]).strip()
  return texts, counts


def chunk_rows(group: int, chunk: int, gen_batch: int) -> int:
  """The rows of a generation chunk of `chunk` prompts from a budget group of `group`: gen_batch, or for a group
  that fits one chunk its prompts rounded up to a multiple of 4."""
  return gen_batch if group > gen_batch else -(-chunk // 4) * 4


@functools.lru_cache(maxsize=32)
def generate_step(mcfg, max_new: int, stops: tuple[int, ...], pad: int):
  """The jitted greedy generation of one chunk: (params, ids [b, t], mask [b, t]) -> the `SampleOutput` of `sample`
  with `max_new` new tokens, a row ending at any of `stops`."""
  def gen(params, ids, mask):
    return sample(params, mcfg, ids, max_new, prompt_mask=mask, stop_tokens=stops, pad_id=pad)
  return jax.jit(gen)


def build_sft(rows: list[dict], max_ratio: float = 1.0) -> list[dict]:
  """Single-question SFT examples from packed traces.

  Args:
    rows: per training question {"id", "question", "single_tokens", "candidates": [{"trace", "tokens",
      "correct"}]} (a candidate per packed answer that gave the question a trace).
    max_ratio: a trace is concise when its tokens < max_ratio * single_tokens.

  Returns:
    {"id", "question", "completion", "tokens"} for each question with a correct concise trace (the shortest).
  """
  out = []
  for row in rows:
    keep = [c for c in row["candidates"] if c["correct"] and c["trace"]
            and c["tokens"] < max_ratio * row["single_tokens"]]
    if keep:
      best = min(keep, key=lambda c: c["tokens"])
      out.append({"id": row["id"], "question": row["question"], "tokens": best["tokens"],
                  "completion": sft_completion(Parsed(1, best["trace"], None))})
  return out


def build_rft(rows: list[dict]) -> list[dict]:
  """Rejection-sampling fine-tuning's examples, the paper's shortest-trace baseline: per training question the
  shortest correct answer among its own single-question samples ({"id", "question", "samples": [{"trace", "tokens",
  "correct"}]}, `build_sft`'s candidate form); a question with none is left out."""
  return build_sft([{"id": r["id"], "question": r["question"], "single_tokens": float("inf"),
                     "candidates": r["samples"]} for r in rows])


def sft_parts(mcfg, cfg: Config, tree):
  """What the fine-tune trains with: (LoRA config, optimizer, loss_fn, the tree's axis rules) for the tree
  {"base": params, "adapter": LoRA} (arrays or ShapeDtypeStructs)."""
  lcfg = lora_config(cfg)
  tx = lora.masked(optax.adam(cfg.lr), tree, (r"^adapter/",))
  sft_loss = losses.sft_loss_fn(mcfg)

  def loss_fn(p, batch, rng):
    return sft_loss(lora.merge(jax.lax.stop_gradient(p["base"]), p["adapter"], lcfg), batch, rng)
  return lcfg, tx, loss_fn, lora.axis_rules(tfm.AXES)


def sft_step(cfg: Config, parts, state, mesh):
  """The fine-tune's jitted train step (`sft_parts`), sharded like `state` (real or abstract) on `mesh`."""
  _, tx, loss_fn, rules = parts
  return recipes.train_step(loss_fn, tx, state, mesh, cfg.strategy, axes=rules)


def lora_config(cfg: Config) -> lora.Config:
  return lora.Config(rank=cfg.lora_rank, alpha=cfg.lora_alpha, targets=("q", "k", "v", "o"))


def finetune(mcfg, params, arrays: dict, cfg: Config):
  """LoRA (q, k, v, o) on the completion-only SFT loss for cfg.steps Adam steps (`jaxlab.train` loop); returns
  (merged params, loss history)."""
  base = jax.tree.map(lambda x: x.copy(), params)  # the train step donates its state
  tree = {"base": base, "adapter": lora.init(lora_config(cfg), base, jax.random.PRNGKey(cfg.seed + 5))}
  parts = sft_parts(mcfg, cfg, tree)
  lcfg, tx, _, rules = parts
  mesh = shd.make_mesh(cfg.mesh) if cfg.mesh else None
  if mesh is None:
    state = state_lib.TrainState(tree, tx.init(tree), np.zeros((), np.int32), jax.random.PRNGKey(cfg.seed))
  else:
    tree = shd.shard_params(tree, mesh, cfg.strategy, axes=rules)
    state = state_lib.state_from_params(tree, tx, cfg.seed, mesh, cfg.strategy, axes=rules)
  bs = min(cfg.batch_size, len(arrays["inputs"]))
  res = loop_lib.train_loop(state, sft_step(cfg, parts, state, mesh), sft_batches(arrays, bs, cfg.seed + 1),
                            cfg.steps, shard_fn=None if mesh is None else functools.partial(shd.shard_batch, mesh=mesh),
                            log_every=1, desc="conpress:sft")
  out = res.state.params
  return lora.merge(out["base"], out["adapter"], lcfg), res.history


def packed_prompts(tok, entries: list[dict], ns, per_question: int, prompts_per_n: int = 0):
  """Prompts of N consecutive questions for each N (the first `prompts_per_n` of them, 0: all): (token lists,
  budgets, (N, first question index) per prompt)."""
  prompts, budgets, where = [], [], []
  for n in ns:
    for s in range(0, len(entries) if not prompts_per_n else min(len(entries), prompts_per_n * n), n):
      prompts.append(chat_ids(tok, pack_prompt([e["question"] for e in entries[s:s + n]])))
      budgets.append(per_question * n)
      where.append((n, s))
  return prompts, budgets, where


def summarize(task: Task, entries: list[dict], ns, where, texts, counts) -> tuple[dict, dict]:
  """tokens_per_question / accuracy / parsed per N, and per N the (question index, Parsed) pairs and verdicts."""
  res, details = {}, {}
  for n in ns:
    rows = [(s, texts[j], counts[j]) for j, (m, s) in enumerate(where) if m == n]
    parsed = [(s + p.number - 1, p) for s, text, _ in rows
              for p in parse_packed(text, n, [e["question"] for e in entries[s:s + n]])]
    right = [task.correct(p.answer, entries[q]) for q, p in parsed]
    res[f"tokens_per_question.n{n}"] = float(np.mean([c / n for _, _, c in rows]))
    res[f"accuracy.n{n}"] = float(np.mean(right))
    res[f"parsed.n{n}"] = float(np.mean([p.answer is not None for _, p in parsed]))
    details[n] = {"parsed": parsed, "right": right}
  return res, details


def tasks(cfg: Config) -> tuple[Task, Task]:
  """The held-out and the training task; no training question is a held-out one (reasoning-gym's seed s + 1 gives
  seed s's questions shifted by one, so other seeds alone would not keep them apart)."""
  test_task = Task(cfg.task, cfg.test_questions, cfg.seed + 1, cfg.terms, cfg.digits)
  return test_task, Task(cfg.train_task or cfg.task, cfg.train_questions, cfg.seed + 2, cfg.terms, cfg.digits,
                         exclude={splits.canonical(e["question"]) for e in test_task.entries})


PLAN_HEAD_TOKENS = 64  # a prompt's chat template and instruction, as `experiments plan` assumes them
PLAN_QUESTION_TOKENS = 128  # a question's tokens in a planned prompt (MATH500's run from tens to a few hundred)


def model_config(cfg: Config):
  """The chat model's config without its weights, as `run` loads it (`jaxlab.hf.hub.config`)."""
  from jaxlab.hf import hub
  from experiments._shared.chat_models import resolve_model
  spec = cfg.model if hub.is_repo_id(cfg.model) else resolve_model(cfg.model)
  return hub.config(spec, cfg.dtype).replace(dtype=cfg.dtype, remat=cfg.remat)


def workloads(cfg: Config, mesh) -> list:
  """The greedy generation of every budget group (`generate`: prompts of N questions with N x max_new_tokens new
  tokens; the single-question group also after each fine-tune) and the train step of the two fine-tunes (ConPress's
  SFT and the RFT baseline), at the preset's
  shapes with abstract arguments (`experiments plan`). Prompt lengths are data: a prompt of N questions is taken as
  PLAN_HEAD_TOKENS + N x PLAN_QUESTION_TOKENS positions (rounded up to 64 as `generate` pads)."""
  from experiments.runner import plan as plan_lib
  mcfg = model_config(cfg)
  params = abstract_params(mcfg, mesh, cfg.strategy)
  eos = mcfg.eos_token_id
  stops = tuple(sorted({eos} if isinstance(eos, int) else set(eos or ())))
  pad, m = mcfg.pad_token_id or 0, cfg.max_new_tokens

  def batch(shapes):  # without cfg.mesh the run shards nothing: every argument whole on its device
    if cfg.mesh:
      return shd.abstract_rows(shapes, mesh)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return {k: jax.ShapeDtypeStruct(s, d, sharding=rep) for k, (s, d) in shapes.items()}

  def prompt_len(n):
    return -(-(PLAN_HEAD_TOKENS + n * PLAN_QUESTION_TOKENS) // 64) * 64
  groups = {n: -(-(min(cfg.test_questions, cfg.prompts_per_n * n) if cfg.prompts_per_n else cfg.test_questions) // n)
            for n in cfg.ns}
  groups[1] += cfg.train_questions
  groups[cfg.train_n] += cfg.packings * (cfg.train_questions // cfg.train_n)
  out = []
  for n, count in groups.items():
    b, t, new = chunk_rows(count, min(count, cfg.gen_batch), cfg.gen_batch), prompt_len(n), n * m
    chunks = -(-count // cfg.gen_batch)
    if n == 1:  # the held-out single questions again after each fine-tune (ConPress's SFT and the RFT baseline)
      chunks += 2 * -(-(groups[1] - cfg.train_questions) // cfg.gen_batch)
    ids = batch({"ids": ((b, t), "int32"), "mask": ((b, t), "int32")})
    flops = tfm.flops_per_token(mcfg, t + new) / 3 * b * (t + new)
    out.append(plan_lib.Workload(f"generate.n{n}", "generate", generate_step(mcfg, new, stops, pad),
                                 (params, ids["ids"], ids["mask"]), chunks, flops, loop_trips=new))
  lcfg = lora_config(cfg)

  def init(key):
    base = tfm.init(mcfg, key)
    return {"base": base, "adapter": lora.init(lcfg, base, key)}
  parts = sft_parts(mcfg, cfg, jax.eval_shape(init, jax.random.PRNGKey(0)))
  state = state_lib.abstract_state(init, parts[1], mesh, cfg.strategy, axes=parts[3])
  length = -(-(PLAN_HEAD_TOKENS + PLAN_QUESTION_TOKENS + m + 1) // 32) * 32
  rows = batch({k: ((cfg.batch_size, length), "int32") for k in ("inputs", "targets", "loss_mask")})
  out.append(plan_lib.Workload("sft_step", "train", sft_step(cfg, parts, state, mesh if cfg.mesh else None),
                               (state, rows), 2 * cfg.steps,
                               tfm.flops_per_token(mcfg, length) * cfg.batch_size * length))
  return out


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # minutes of work at the cpu preset; recomputed
  t0 = time.time()
  test_task, train_task = tasks(cfg)
  mcfg, params, tok = load_chat_model(cfg.model, cfg.dtype)
  mcfg = mcfg.replace(dtype=cfg.dtype, remat=cfg.remat)
  if cfg.mesh:
    params = shd.shard_params(params, shd.make_mesh(cfg.mesh), cfg.strategy, axes=tfm.AXES)
  return run_with_model(cfg, out_dir, mcfg, params, tok, test_task, train_task, {"load": time.time() - t0})


def run_with_model(cfg: Config, out_dir: str, mcfg, params, tok, test_task: Task, train_task: Task,
                   clock: dict | None = None) -> dict:
  """The experiment on a loaded chat model (`tok` with a chat template) and its held-out / training tasks."""
  t0 = time.time() - sum((clock or {}).values())
  clock = dict(clock or {})
  test, train = test_task.entries, train_task.entries
  asked = test[:min(len(test), cfg.prompts_per_n * cfg.ns[-1])] if cfg.prompts_per_n else test
  splits.record(out_dir, "conpress", {"train": {"questions": [e["question"] for e in train]},
                                      "test": {"questions": [e["question"] for e in asked]}})

  # the held-out questions at every N; each training question alone, and packed train_n at a time in
  # `packings` random groupings; all in one generation pass
  prompts, budgets, where = packed_prompts(tok, test, cfg.ns, cfg.max_new_tokens, cfg.prompts_per_n)
  n_test = len(prompts)
  prompts += [chat_ids(tok, pack_prompt([e["question"]])) for e in train]
  budgets += [cfg.max_new_tokens] * len(train)
  rng, groups = np.random.default_rng(cfg.seed), []
  for _ in range(cfg.packings):
    perm = rng.permutation(len(train))
    for s in range(0, len(train) - cfg.train_n + 1, cfg.train_n):
      groups.append([int(i) for i in perm[s:s + cfg.train_n]])
      prompts.append(chat_ids(tok, pack_prompt([train[i]["question"] for i in groups[-1]])))
      budgets.append(cfg.max_new_tokens * cfg.train_n)
  shape = (-(-max(map(len, prompts)) // 64) * 64, max(budgets)) if cfg.one_shape else None
  texts, counts = generate(params, mcfg, tok, prompts, budgets, cfg.gen_batch, shape)
  clock["generate"] = time.time() - t0 - sum(clock.values())

  res, details = summarize(test_task, test, cfg.ns, where, texts[:n_test], counts[:n_test])
  res["per_item"] = {"accuracy.n1": [float(r) for r in details[1]["right"]]}  # the held-out single questions
  big = details[cfg.ns[-1]]
  for i in range(1, cfg.ns[-1] + 1):
    at = [(p, r) for (_, p), r in zip(big["parsed"], big["right"]) if p.number == i]
    toks = [len(tok.encode(p.trace)) + (len(tok.encode(p.reasoning)) if p.reasoning else 0) for p, _ in at if p.trace]
    res[f"position_tokens.{i}"] = float(np.mean(toks)) if toks else float("nan")
    res[f"position_accuracy.{i}"] = float(np.mean([r for _, r in at]))

  single = counts[n_test:n_test + len(train)]
  rows = [{"id": i, "question": e["question"], "single_tokens": int(single[i]), "candidates": []}
          for i, e in enumerate(train)]
  for g, text in zip(groups, texts[n_test + len(train):]):
    for p in parse_packed(text, cfg.train_n, [train[i]["question"] for i in g]):
      if p.trace:
        q = g[p.number - 1]
        rows[q]["candidates"].append({"trace": p.trace, "tokens": len(tok.encode(sft_completion(p))) + 1,
                                      "correct": train_task.correct(p.answer, train[q])})
  examples = build_sft(rows, cfg.max_ratio)
  res.update({"sft.examples": len(examples), "sft.candidates": sum(len(r["candidates"]) for r in rows),
              "sft.correct_candidates": sum(c["correct"] for r in rows for c in r["candidates"]),
              "sft.train_single_tokens": float(np.mean(single)),
              "sft.target_tokens": float(np.mean([e["tokens"] for e in examples])) if examples else float("nan"),
              "sft.tokens_before": res["tokens_per_question.n1"], "sft.accuracy_before": res["accuracy.n1"],
              "baseline.n": cfg.train_n, "baseline.tokens": res[f"tokens_per_question.n{cfg.train_n}"],
              "baseline.accuracy": res[f"accuracy.n{cfg.train_n}"]})
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as metrics:
    for n in cfg.ns:
      metrics.write(json.dumps({"phase": "measure", "n": n, **{k: v for k, v in res.items()
                                                              if k.endswith(f".n{n}")}}) + "\n")
    singles = [j for j, (n, _) in enumerate(where) if n == 1]

    def tune_and_measure(name: str, chosen: list[dict]):
      """Fine-tunes on `chosen` and measures the held-out single questions: res[name.loss_*, .tokens_after,
      .accuracy_after] (NaN without examples)."""
      if not chosen:
        res[f"{name}.tokens_after"] = res[f"{name}.accuracy_after"] = float("nan")
        return
      p_ids = [chat_ids(tok, pack_prompt([e["question"]])) for e in chosen]
      c_ids = [tok.encode(e["completion"]) + [tok.eos_id] for e in chosen]
      length = -(-max(len(p) + len(c) for p, c in zip(p_ids, c_ids)) // 32) * 32
      tuned, history = finetune(mcfg, params, sft_batch(p_ids, c_ids, length, pad_id=tok.batch_pad_id), cfg)
      metrics.writelines(json.dumps({"phase": name, **r}) + "\n" for r in history)
      res[f"{name}.loss_first"], res[f"{name}.loss_last"] = history[0]["loss"], history[-1]["loss"]
      texts1, counts1 = generate(tuned, mcfg, tok, [prompts[j] for j in singles], [budgets[j] for j in singles],
                                 cfg.gen_batch, shape)
      after, after_details = summarize(test_task, test, (1,), [where[j] for j in singles], texts1, counts1)
      res["per_item"][f"{name}.accuracy_after"] = [float(r) for r in after_details[1]["right"]]
      res[f"{name}.tokens_after"], res[f"{name}.accuracy_after"] = after["tokens_per_question.n1"], after["accuracy.n1"]

    tune_and_measure("sft", examples)
    clock["sft"] = time.time() - t0 - sum(clock.values())
    samples = [{"id": i, "question": e["question"], "samples": [
        {"trace": p.trace, "tokens": len(tok.encode(sft_completion(p))) + 1,
         "correct": train_task.correct(p.answer, e)} for p in parse_packed(text, 1, [e["question"]]) if p.trace]}
        for i, (e, text) in enumerate(zip(train, texts[n_test:n_test + len(train)]))]
    rft = build_rft(samples)
    res["rft.examples"] = len(rft)
    res["rft.target_tokens"] = float(np.mean([e["tokens"] for e in rft])) if rft else float("nan")
    tune_and_measure("rft", rft)
    clock["rft"] = time.time() - t0 - sum(clock.values())
  res["seconds"] = time.time() - t0
  res.update({f"seconds.{k}": v for k, v in clock.items()})
  registry.plot_curves(os.path.join(out_dir, "tokens_by_n.png"),
                       {"tokens per question": (list(cfg.ns), [res[f"tokens_per_question.n{n}"] for n in cfg.ns])},
                       title="conpress: reasoning tokens per question by questions per prompt",
                       xlabel="questions per prompt (N)", ylabel="tokens per question")
  pos = list(range(1, cfg.ns[-1] + 1))
  registry.plot_curves(os.path.join(out_dir, "position_tokens.png"),
                       {"trace tokens": (pos, [res[f"position_tokens.{i}"] for i in pos])},
                       title=f"conpress: trace tokens by position in prompts of N = {cfg.ns[-1]}",
                       xlabel="position", ylabel="tokens")
  return res
