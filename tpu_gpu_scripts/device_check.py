"""Figures for one device check (run by device_check.sh): spec-verify Pallas kernel vs its jnp reference, the
llama-60m train step (MFU against the chip's bf16 peak), and greedy decoding of SmolLM2-135M-Instruct with
fp32/bf16/int8 weights at several batch sizes. Writes one JSON after every section, so a run cut short keeps
what it measured; a failing section records its error and the others still run.

  python tpu_gpu_scripts/device_check.py --out figures.json [--small]

--small (or DEVICE_CHECK_SMALL=1) runs tiny random shapes, for a CPU smoke test of the script itself.
MFU (PaLM, arXiv 2204.02311, appendix B) counts `transformer.flops_per_token` against the bf16 dense peak
(the H200's published 989 TFLOP/s when the device kind names it, and a measured bf16 matmul peak).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

PUBLISHED_BF16_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12}  # dense bf16 FLOP/s per chip


def _best_s(fn, repeats: int) -> float:
  jax.block_until_ready(fn())
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return best


def spec_verify(small: bool) -> dict:
  from kernels.spec_verify import spec_verify_attention, spec_verify_reference
  b, t, h, g, k, s, nb = (1, 32, 2, 2, 16, 32, 2) if small else (8, 256, 16, 4, 128, 2048, 4)
  out = {}
  for dt in ("float32", "bfloat16"):
    ks = jax.random.split(jax.random.PRNGKey(0), 6)
    rnd = lambda key, shape, dt=dt: jax.random.normal(key, shape, jnp.float32).astype(dt)
    branch = jax.random.randint(ks[5], (b, t), 0, nb).at[:, :nb].set(jnp.arange(nb))
    args = (rnd(ks[0], (b, t, h, k)), rnd(ks[1], (b, s, g, k)), rnd(ks[2], (b, s, g, k)), rnd(ks[3], (b, t, g, k)),
            rnd(ks[4], (b, t, g, k)), jnp.full((b,), s - 3, jnp.int32), branch)
    ref_fn = jax.jit(spec_verify_reference)
    err = jnp.max(jnp.abs(spec_verify_attention(*args).astype(jnp.float32) - ref_fn(*args).astype(jnp.float32)))
    kern_s = _best_s(lambda args=args: spec_verify_attention(*args), 3)
    ref_s = _best_s(lambda args=args, ref_fn=ref_fn: ref_fn(*args), 3)
    out.update({f"spec_verify_{dt}_kernel_s": kern_s, f"spec_verify_{dt}_reference_s": ref_s,
                f"spec_verify_{dt}_speedup": ref_s / kern_s, f"spec_verify_{dt}_max_abs_err": float(err)})
  out["spec_verify_shape"] = dict(B=b, T=t, H=h, G=g, K=k, S=s, branches=nb)
  return out


def train_step(small: bool) -> dict:
  import optax
  from jaxlab.models import transformer as tfm
  from jaxlab.train import metrics, state as st, step as sp
  name, batch, seq, steps = ("tiny", 2, 32, 2) if small else ("llama-60m", 32, 1024, 10)
  cfg = tfm.PRESETS[name].replace(dtype="bfloat16")
  tx = optax.adamw(1e-3)
  state = st.create(tfm.init(cfg, jax.random.PRNGKey(0)), tx)
  step = sp.jit_train_step(sp.make_train_step(sp.lm_loss_fn(cfg, document_mask=False), tx))
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1)).astype(np.int32)
  data = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  t0 = time.perf_counter()
  state, m = step(state, data)
  first = float(m["loss"])
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, m = step(state, data)
    loss = float(m["loss"])
    times.append(time.perf_counter() - t0)
  step_s = float(np.median(times))
  tok_s = batch * seq / step_s
  fpt = tfm.flops_per_token(cfg, seq)
  kind = jax.devices()[0].device_kind
  published = next((v for k, v in PUBLISHED_BF16_PEAK.items() if k in kind), None)
  measured = metrics.measure_device_matmul_flops(n=512 if small else 8192, repeats=3, dtype="bfloat16")
  out = {"train_model": name, "train_batch": batch, "train_seq": seq, "train_compile_s": compile_s,
         "train_step_s": step_s, "train_tokens_per_s": tok_s, "train_first_loss": first, "train_last_loss": loss,
         "bf16_matmul_peak_measured": measured, "train_mfu_vs_measured_peak": fpt * tok_s / measured}
  if published:
    out.update(bf16_peak_published=published, train_mfu=fpt * tok_s / published)
  return out


def decode(small: bool) -> dict:
  from jaxlab.generate import quant, sample
  from jaxlab.models import transformer as tfm
  if small:
    name, batches, new = "tiny", (1, 2), 8
    cfg = tfm.Config.tiny()
    params = tfm.init(cfg, jax.random.PRNGKey(0))
  else:
    from jaxlab import hf
    from jaxlab.models.registry import real_model_path
    name, batches, new = "smollm2-135m-instruct", (1, 8, 64), 128
    cfg, params = hf.load(real_model_path(name))
  cfg = cfg.replace(eos_token_id=None)
  out = {"decode_model": name, "decode_new_tokens": new}
  for mode in quant.MODES:
    q = quant.quantize(params, mode)
    for b in batches:
      prompt = np.random.default_rng(b).integers(0, cfg.vocab_size, (b, 16)).astype(np.int32)
      run = lambda q=q, prompt=prompt: sample(q, cfg, prompt, new).tokens
      t0 = time.perf_counter()
      tokens = np.asarray(run())
      out[f"decode_{mode}_b{b}_compile_s"] = time.perf_counter() - t0
      out[f"decode_{mode}_b{b}_tokens_per_s"] = b * new / _best_s(run, 2)
      if mode == "fp32":
        out[f"_tokens_b{b}"] = tokens
      else:
        out[f"decode_{mode}_b{b}_agreement_with_fp32"] = float(np.mean(tokens == out[f"_tokens_b{b}"]))
  return {k: v for k, v in out.items() if not k.startswith("_")}


SECTIONS = {"spec_verify": spec_verify, "train_step": train_step, "decode": decode}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="the JSON file to write")
  p.add_argument("--small", action="store_true", default=os.environ.get("DEVICE_CHECK_SMALL") == "1")
  p.add_argument("--sections", default=",".join(SECTIONS))
  p.add_argument("--kernel-tests-rc", type=int, default=None, help="exit status of the kernel tests (recorded)")
  args = p.parse_args(argv)
  dev = jax.devices()[0]
  res = {"backend": jax.default_backend(), "device_kind": dev.device_kind, "device_count": jax.device_count(),
         "jax_version": jax.__version__, "small": args.small, "errors": {}}
  if args.kernel_tests_rc is not None:
    res["kernel_tests_rc"] = args.kernel_tests_rc
  t_all = time.perf_counter()
  for name in args.sections.split(","):
    t0 = time.perf_counter()
    try:
      res.update(SECTIONS[name](args.small))
    except Exception:  # one broken section must not lose the others' figures
      res["errors"][name] = traceback.format_exc(limit=4)[-2000:]
    res[f"{name}_section_s"] = time.perf_counter() - t0
    res["total_s"] = time.perf_counter() - t_all
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(res, f, indent=2, default=float)
  print(json.dumps({k: v for k, v in res.items() if k != "errors"}, default=float))
  for name, err in res["errors"].items():
    print(f"section {name} failed:\n{err}", file=sys.stderr)
  return 1 if res["errors"] else 0


if __name__ == "__main__":
  sys.exit(main())
