"""The run of cdka: what `python -m experiments run cdka` executes (its Config, presets and claims are in
`experiments/cdka/__init__.py`, the paper and its departures in `experiments/cdka/README.md`)."""
from __future__ import annotations

import dataclasses
import math
import os

import jax
import numpy as np

from experiments._shared import adapters as common
from experiments._shared import chat_models
from experiments import registry
from experiments._shared import recipes
from experiments._shared.recipes import optimizer
from experiments.runner import splits
from jaxlab.adapters import kron, lora
from jaxlab.data import corpus as corpus_lib
from jaxlab.data.tasks import arithmetic
from jaxlab.evals import answers
from jaxlab import sharding as shd
from jaxlab.models import transformer as tfm
from jaxlab.train import loop as loop_lib
from jaxlab.train import schedules
from jaxlab.train import state as state_lib
from experiments.cdka import Config


def lora_budget(shapes: dict, rank: int) -> int:
  """LoRA's trainable params over `shapes` ({path: [..., in, out]}): rank * (in + out) per matrix."""
  return sum(math.prod(s[:-2]) * rank * (s[-2] + s[-1]) for s in shapes.values())


def cdka_budget(shapes: dict, r: int, r1: int, r2: int) -> int:
  return sum(math.prod(s[:-2]) * kron.num_params(s[-2], s[-1], r, r1, r2) for s in shapes.values())


def _fits(shapes: dict, r1: int, r2: int) -> bool:
  return all(s[-1] % r1 == 0 and s[-2] % r2 == 0 for s in shapes.values())


def choose_cdka(shapes: dict, rank: int, tol: float, prefer: str = "rank") -> dict:
  """(r, r1, r2) for every target shape at LoRA rank `rank`'s total budget (within `tol`).

  `kron.recommend(prefer=...)` on the first target shape with LoRA's per-matrix budget; when that choice does
  not divide every target or misses the total budget, the next feasible config in the same preference order.
  """
  d_in, d_out = next(iter(shapes.values()))[-2:]
  per = rank * (d_in + d_out)
  total = lora_budget(shapes, rank)
  t1, t2 = kron.RECOMMENDED

  def dist(c):
    return abs(math.log2(c["r1"] / t1)) + abs(math.log2(c["r2"] / t2))
  order_key = ((lambda c: (-c["rank_bound"], dist(c), -c["params"], c["r"])) if prefer == "rank" else
               (lambda c: (dist(c), -c["r"], -c["rank_bound"])))
  first = kron.recommend(d_in, d_out, per, prefer)
  for c in [first] + sorted(kron.feasible_configs(d_in, d_out, per), key=order_key):
    if _fits(shapes, c["r1"], c["r2"]):
      n = cdka_budget(shapes, c["r"], c["r1"], c["r2"])
      if abs(n - total) <= tol * total:
        return {"r": c["r"], "r1": c["r1"], "r2": c["r2"], "params": n}
  raise ValueError(f"no CDKA (r, r1, r2) divides every target {sorted(set(shapes.values()))} within "
                   f"{tol:.0%} of LoRA rank {rank}'s {total} params")


def metamath_gsm(path: str, tok, limit: int, max_tokens: int, template: str) -> list[arithmetic.Example]:
  """The reference's training set from a MetaMathQA JSONL file: the records whose `type` names GSM8K, in file order,
  as `template`-prompted examples whose target is the response up to its "The answer is:" line (the answer is the
  number after it), kept while prompt + " " + target is under `max_tokens` tokens and the training row fits
  `max_tokens` positions; the first `limit` kept."""
  types, qs, rs = (corpus_lib.jsonl_corpus(path, field=f) for f in ("type", "query", "response"))
  out = []
  for i in range(len(qs)):
    if len(out) == limit:
      break
    if "GSM" not in types[i]:
      continue
    response = rs[i]
    if "The answer is:" not in response:
      raise ValueError(f"{path} record {i}: expected a response ending in 'The answer is: N', found "
                       f"{response[-60:]!r}")
    tail = response.rsplit("The answer is:", 1)[1].strip()
    m = arithmetic.NUMBER.search(tail)
    prompt, target = template.format(q=qs[i]), response.split("\nThe answer is:")[0]
    row = len(tok.encode(prompt, add_bos=True)) + len(tok.encode(target, add_eos=True)) - 1
    if len(tok.encode(prompt + " " + target, add_bos=True)) < max_tokens and row <= max_tokens:
      out.append(arithmetic.Example(prompt, arithmetic.normalize(m.group(0) if m else tail), 0, target))
  if not out:
    raise ValueError(f"{path}: no GSM-derived MetaMathQA record under {max_tokens} tokens")
  return out


def reference_context(cfg: Config, out_dir: str, writer) -> common.Context:
  """`common.prepare`'s context on the reference's data (`Config.data` "metamath_gsm"): `metamath_gsm` for training,
  the test file read with the same template."""
  setup = cfg.setup
  ctx = common.prepare(dataclasses.replace(setup, train_examples=1, test_examples=1), out_dir, writer, cfg.seed)
  train = metamath_gsm(setup.train_path, ctx.tok, cfg.train_records, setup.seq_len, cfg.template)
  test = arithmetic.load_jsonl(setup.test_path, setup.test_format, setup.test_examples or None, cfg.template)
  need = max(len(ctx.tok.encode(e.prompt)) + len(ctx.tok.encode(e.target)) + 1 for e in train)
  fits = [e for e in test if len(ctx.tok.encode(e.prompt)) + len(ctx.tok.encode(e.target)) + 1 <= setup.seq_len]
  return dataclasses.replace(ctx, setup=setup, train=train, test=test,
                             train_arrays=arithmetic.sft_arrays(train, ctx.tok, min(-(-need // 8) * 8, setup.seq_len)),
                             test_arrays=arithmetic.sft_arrays(fits or test[:1], ctx.tok, setup.seq_len))


def split_items(train, test) -> dict:
  """The run's splits: the fine-tuning questions (`train`) and the test questions."""
  return {"train": {"questions": [e.prompt for e in train]}, "test": {"questions": [e.prompt for e in test]}}


def _masked_adapter_loss(merge_fn, sft_loss):
  def loss_fn(params, batch, rng):
    base = jax.lax.stop_gradient(params["base"])
    return sft_loss(merge_fn(base, params["adapter"]), batch, rng)
  return loss_fn


def method_parts(cfg: Config, model_cfg: tfm.Config, lr: float, adapter_mod, adapter_cfg, params):
  """What one method's fine-tuning trains with: (schedule, optimizer, loss_fn, the params' axis rules, merge).

  Args:
    params: the trained tree (arrays or ShapeDtypeStructs): the model's params (adapter_mod None: every param is
      trained), else {"base": ..., "adapter": ...} with only the adapter trained.
  """
  schedule = schedules.get("cosine", lr, cfg.steps, cfg.warmup_steps, cfg.lr_floor)
  inner = optimizer(schedule, "adamw", cfg.grad_clip, weight_decay=cfg.weight_decay)
  sft_loss = common.sft_loss_fn(model_cfg)
  if adapter_mod is None:
    return schedule, inner, sft_loss, tfm.AXES, None

  def merge(b, a):
    return adapter_mod.merge(b, a, adapter_cfg)
  tx = lora.masked(inner, params, (r"^adapter/",))
  return schedule, tx, _masked_adapter_loss(merge, sft_loss), adapter_mod.axis_rules(tfm.AXES), merge


def train_step(cfg: Config, parts, state, mesh):
  """The jitted train step of a method (`method_parts`), sharded like `state` (real or abstract) on `mesh`."""
  schedule, tx, loss_fn, rules, _ = parts
  return recipes.train_step(loss_fn, tx, state, mesh, cfg.strategy, axes=rules, schedule=schedule)


def finetune(cfg: Config, ctx: common.Context, lr: float, adapter_mod, adapter_cfg, key, writer, name: str):
  """Fine-tunes the base (adapter_mod None: every param) for cfg.steps AdamW steps.

  Returns:
    (effective params, trainable param count, loss history).
  """
  base = jax.tree.map(lambda x: x.copy(), ctx.params)  # the train step donates its state
  params = base if adapter_mod is None else {"base": base, "adapter": adapter_mod.init(adapter_cfg, base, key)}
  parts = method_parts(cfg, ctx.model, lr, adapter_mod, adapter_cfg, params)
  _, tx, _, rules, merge = parts
  trainable = tfm.num_params(params if adapter_mod is None else params["adapter"])
  mesh = common.mesh_of(cfg.mesh)
  if mesh is not None:
    params = shd.shard_params(params, mesh, cfg.strategy, axes=rules)
  state = state_lib.state_from_params(params, tx, cfg.seed, mesh, cfg.strategy, axes=rules)
  batches = common.sft_batches(ctx.train_arrays, cfg.batch_size, cfg.seed + 1)
  res = loop_lib.train_loop(state, train_step(cfg, parts, state, mesh), batches, cfg.steps,
                            shard_fn=common.shard_fn(mesh), log_every=cfg.log_every, desc=f"cdka:{name}")
  for r in res.history:
    writer.write({"phase": "finetune", "method": name, **r})
  out = res.state.params
  effective = out if adapter_mod is None else merge(out["base"], out["adapter"])
  return effective, trainable, res.history


def _matrices(shapes: dict, limit: int) -> list[tuple[str, int | None]]:
  items = [(p, i) for p, s in shapes.items() for i in (range(s[0]) if len(s) == 3 else [None])]
  if limit and len(items) > limit:
    items = [items[j] for j in np.linspace(0, len(items) - 1, limit).round().astype(int)]
  return items


def analysis_configs(shapes: dict, rank: int, chosen: list[dict], tol: float) -> list[dict]:
  """LoRA (r1 = r2 = 1), r1 = r2 = s for every s dividing every target (exactly LoRA's budget: r (p q + m n) =
  r (out + in) when r1 = r2), and the `chosen` CDKA configs."""
  cands = [{"r": rank, "r1": s, "r2": s} for s in (1, 2, 4, 8, 16, 32) if _fits(shapes, s, s)]
  cands += [{k: c[k] for k in ("r", "r1", "r2")} for c in chosen]
  out, seen = [], set()
  for c in cands:
    key = (c["r"], c["r1"], c["r2"])
    if key not in seen:
      seen.add(key)
      out.append(c)
  return out


def alignment(base, full, adapters: dict, shapes: dict, configs: list[dict], limit: int) -> dict:
  """Relative error of the best approximation of the full update per config, and the trained adapters' cosine.

  Args:
    base, full: params before and after full fine-tuning.
    adapters: {method: effective params after adapter fine-tuning}.
    shapes: {kernel path: shape} of the targets.
    configs: (r, r1, r2) dicts to analyse.
    limit: analyse at most this many matrices (0: all).
  """
  errs = {c_key(c): [] for c in configs}
  cos = {m: [] for m in adapters}
  for path, i in _matrices(shapes, limit):
    def mat(tree, path=path, i=i):
      w = np.asarray(jax.device_get(lora.get_path(tree, path)), np.float64)
      return w if i is None else w[i]
    w0 = mat(base)
    dw = (mat(full) - w0).T  # [out, in]
    if not np.any(dw):
      continue
    for c in configs:
      errs[c_key(c)].append(kron.nearest_kron(dw, c["r1"], c["r2"], c["r"])[2])
    for m, p in adapters.items():
      da = (mat(p) - w0).T
      cos[m].append(float(np.sum(da * dw) / (np.linalg.norm(da) * np.linalg.norm(dw) + 1e-30)))
  return {"rel_error": {k: float(np.mean(v)) if v else float("nan") for k, v in errs.items()},
          "cosine": {m: float(np.mean(v)) if v else float("nan") for m, v in cos.items()}}


def c_key(c: dict) -> str:
  return f"r{c['r']}_r1{c['r1']}_r2{c['r2']}"


def _cdka_configs(cfg: Config, shapes: dict) -> dict:
  """{"cdka": chosen, "cdka_alt": the other preference} as (r, r1, r2, params) dicts."""
  alt = "shape" if cfg.cdka_prefer == "rank" else "rank"
  out = {"cdka_alt": choose_cdka(shapes, cfg.lora_rank, cfg.budget_tolerance, alt)}
  if cfg.cdka_r:
    out["cdka"] = {"r": cfg.cdka_r, "r1": cfg.cdka_r1, "r2": cfg.cdka_r2,
                   "params": cdka_budget(shapes, cfg.cdka_r, cfg.cdka_r1, cfg.cdka_r2)}
  else:
    out["cdka"] = choose_cdka(shapes, cfg.lora_rank, cfg.budget_tolerance, cfg.cdka_prefer)
  return out


def method_specs(cfg: Config, shapes: dict) -> tuple[dict, dict]:
  """({method: (adapter module or None for full fine-tuning, its config, learning rate)}, the CDKA configs) for the
  targets' `shapes`."""
  lcfg = lora.Config(rank=cfg.lora_rank, alpha=cfg.lora_alpha, targets=cfg.targets, rslora=cfg.lora_rslora)
  kconfigs = _cdka_configs(cfg, shapes) if any(m.startswith("cdka") for m in cfg.methods) else {}
  specs = {"full": (None, None, cfg.lr_full), "lora": (lora, lcfg, cfg.lr_lora)}
  for m, c in kconfigs.items():
    specs[m] = (kron, kron.Config(r=c["r"], r1=c["r1"], r2=c["r2"], alpha=cfg.cdka_alpha, targets=cfg.targets),
                cfg.lr_cdka)
  return specs, kconfigs


PLAN_TEST_EXAMPLES = 1319  # GSM8K's test split, which the full preset evaluates whole (setup.test_examples 0)


def workloads(cfg: Config, mesh) -> list:
  """Each method's train step and the steps of every evaluation (the base's and each method's greedy generation and
  test loss), at the preset's shapes with abstract arguments (`experiments plan`); the alignment analysis runs in
  NumPy on the host. Rows hold setup.seq_len positions (the longest kept training record nears it)."""
  from experiments.runner import plan as plan_lib
  model_cfg = common.model_config(cfg.setup)
  base = chat_models.abstract_params(model_cfg, mesh, cfg.strategy)
  specs, _ = method_specs(cfg, lora.target_paths(base, cfg.targets))
  seq = cfg.setup.seq_len
  batch = shd.abstract_rows({k: ((cfg.batch_size, seq), "int32") for k in ("inputs", "targets", "loss_mask")}, mesh)
  flops = tfm.flops_per_token(model_cfg, seq) * cfg.batch_size * seq
  out = []
  for method in cfg.methods:
    mod, acfg, lr = specs[method]

    def init(key, mod=mod, acfg=acfg):
      b = tfm.init(model_cfg, key)
      return b if mod is None else {"base": b, "adapter": mod.init(acfg, b, key)}
    parts = method_parts(cfg, model_cfg, lr, mod, acfg, jax.eval_shape(init, jax.random.PRNGKey(0)))
    state = state_lib.abstract_state(init, parts[1], mesh, cfg.strategy, axes=parts[3])
    out.append(plan_lib.Workload(f"train_step.{method}", "train", train_step(cfg, parts, state, mesh), (state, batch),
                                 cfg.steps, flops))
  tests = cfg.setup.test_examples if cfg.setup.train_path is None or cfg.setup.test_examples else PLAN_TEST_EXAMPLES
  return out + common.eval_workloads(cfg.setup, model_cfg, base, mesh, 1 + len(cfg.methods), tests)


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # a finished run is cheap to repeat; nothing is checkpointed mid-way
  common.check_paths(cfg.setup)
  writer = common.Writer(os.path.join(out_dir, "metrics.jsonl"))
  ctx = (reference_context(cfg, out_dir, writer) if cfg.data == "metamath_gsm" else
         common.prepare(cfg.setup, out_dir, writer, cfg.seed))
  ctx = dataclasses.replace(ctx, params=chat_models.place(ctx.params, common.mesh_of(cfg.mesh), cfg.strategy))
  splits.record(out_dir, "cdka", split_items(ctx.train, ctx.test))
  shapes = lora.target_paths(ctx.params, cfg.targets)
  adapters, kconfigs = method_specs(cfg, shapes)
  results: dict = {"accuracy": {}, "trainable_params": {}, "final_loss": {}, "test_loss": {}}
  results["accuracy"]["base"] = ctx.evaluate(ctx.params)[0]
  results["test_loss"]["base"] = ctx.test_loss(ctx.params)
  if cfg.setup.train_path is None:
    results["base_equation_accuracy"] = ctx.evaluate(ctx.params, arithmetic.equation_problems(
        cfg.setup.arithmetic(), cfg.setup.test_examples, "test", cfg.seed + 12))[0]
  curves, effective, key = {}, {}, jax.random.PRNGKey(cfg.seed + 2)
  completions_path = common.fresh(os.path.join(out_dir, "completions.jsonl"))
  for method in cfg.methods:
    mod, acfg, lr = adapters[method]
    params, n, hist = finetune(cfg, ctx, lr, mod, acfg, key, writer, method)
    acc, completions = ctx.evaluate(params)
    common.write_completions(completions_path, method, ctx.test, completions)
    results["accuracy"][method] = acc
    results.setdefault("per_item", {})[f"accuracy.{method}"] = [
        float(answers.exact_match(c, e.answer)) for c, e in zip(completions, ctx.test)]  # paired: the same test set
    results["trainable_params"][method] = n
    results["final_loss"][method] = hist[-1]["loss"]
    results["test_loss"][method] = ctx.test_loss(params)
    curves[method] = ([r["step"] for r in hist], [r["loss"] for r in hist])
    effective[method] = params
    writer.write({"phase": "eval", "method": method, "accuracy": acc, "trainable_params": n,
                  "examples": [[e.prompt, c] for e, c in zip(ctx.test[:5], completions[:5])]})
    print(f"cdka: {method} accuracy {acc:.3f} with {n} trainable params", flush=True)
  for m, c in kconfigs.items():
    results[f"{m}_config"] = f"r={c['r']},r1={c['r1']},r2={c['r2']}"
    results[f"{m}_rank_bound"] = min(kron.rank_bound(s[-2], s[-1], c["r"], c["r1"], c["r2"]) for s in shapes.values())
  results["cdka_prefer"] = cfg.cdka_prefer if not cfg.cdka_r else "fixed"
  results["lora_rank"] = cfg.lora_rank
  plots = {}
  if cfg.analysis and "full" in effective:
    configs = analysis_configs(shapes, cfg.lora_rank, [c for m, c in kconfigs.items() if m in cfg.methods],
                               cfg.budget_tolerance)
    al = alignment(ctx.params, effective["full"], {m: p for m, p in effective.items() if m != "full"}, shapes,
                   configs, cfg.analysis_max_matrices)
    results["alignment"] = al
    writer.write({"phase": "alignment", **al, "configs": configs})
    plots = {c_key(c): (al["rel_error"][c_key(c)], cdka_budget(shapes, c["r"], c["r1"], c["r2"]),
                        min(kron.rank_bound(s[-2], s[-1], c["r"], c["r1"], c["r2"]) for s in shapes.values()))
             for c in configs}
  writer.close()
  if jax.process_index() == 0:
    registry.plot_curves(os.path.join(out_dir, "loss.png"), curves, ylabel="fine-tuning loss (answer tokens)",
                         title="cdka: full vs LoRA vs CDKA", logy=True)
    if plots:
      common.bar_plot(os.path.join(out_dir, "alignment.png"), {k: v[0] for k, v in plots.items()},
                      ylabel="rel. error of best approx. of full-FT dW",
                      title=f"same budget as LoRA rank {cfg.lora_rank} (r1=r2=1 is LoRA)")
    _write_table(os.path.join(out_dir, "table.md"), cfg, results, plots)
  return results


def _write_table(path: str, cfg: Config, res: dict, plots: dict) -> None:
  lr = {"full": cfg.lr_full, "lora": cfg.lr_lora, "cdka": cfg.lr_cdka, "cdka_alt": cfg.lr_cdka}
  lines = ["| method | accuracy | test loss | trainable params | lr | final train loss |",
           "|---|---|---|---|---|---|",
           f"| base (no fine-tuning) | {res['accuracy']['base']:.3f} | {res['test_loss']['base']:.4f} | 0 | - | - |"]
  for m in cfg.methods:
    name = {"full": "full", "lora": f"LoRA r={cfg.lora_rank}"}.get(m) or f"{m} {res[m + '_config']}"
    lines.append(f"| {name} | {res['accuracy'][m]:.3f} | {res['test_loss'][m]:.4f} | {res['trainable_params'][m]} | "
                 f"{lr[m]:g} | {res['final_loss'][m]:.4f} |")
  if plots:
    lines += ["", "Alignment with the full fine-tuning update (mean over matrices of the relative Frobenius error "
              "of the best approximation with that structure):", "",
              "| (r, r1, r2) | params | rank bound | rel. error |", "|---|---|---|---|"]
    lines += [f"| {k} | {n} | {rb} | {e:.4f} |" for k, (e, n, rb) in plots.items()]
    lines += ["", "Cosine of the trained adapters' update with the full update: "
              + ", ".join(f"{m} {v:.3f}" for m, v in res["alignment"]["cosine"].items())]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
