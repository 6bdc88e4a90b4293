"""Checkpoints named by their Hugging Face repo id: where a downloaded one is, how to fetch a missing one, and its
architecture without its weights.

A full preset names the paper's model as a repo id ("GSAI-ML/LLaDA-8B-Instruct"). `local_path(repo)` finds it under
`$JAXLAB_MODELS` (default `models/`, as `models/<org>/<name>`) or in the Hugging Face cache; `fetch_command(repo)`
is the one command that puts it there. `architecture(ref)` is a checkpoint's config.json as a dict, read from the
checkpoint when it is on disk and otherwise from the copy this package ships (`configs/<org>--<name>.json`, the
architecture fields of the repo's config.json), so that `experiments plan` sizes a paper's model from a fresh clone.
`config(ref)` is the jaxlab config of that architecture.
"""
from __future__ import annotations

import glob
import json
import os

MODELS_ENV = "JAXLAB_MODELS"
CONFIGS_DIR = os.path.join(os.path.dirname(__file__), "configs")


def is_repo_id(ref: str) -> bool:
  """Whether `ref` reads as "org/name" (or "datasets/org/name") rather than a path on this machine."""
  ref = os.fspath(ref)
  parts = ref.removeprefix("datasets/").split("/")
  return (len(parts) == 2 and all(parts) and not ref.startswith((".", "/", "~")) and not os.path.exists(ref)
          and not ref.endswith((".gguf", ".json", ".jsonl")))


def models_dir() -> str:
  return os.environ.get(MODELS_ENV, "models")


def local_path(repo: str) -> str | None:
  """The directory holding the downloaded repo `repo` ("org/name"; "datasets/org/name" for a dataset), or None."""
  d = os.path.join(models_dir(), repo)
  if os.path.isdir(d) and os.listdir(d):
    return d
  kind, name = ("datasets", repo.removeprefix("datasets/")) if repo.startswith("datasets/") else ("models", repo)
  cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
      os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface")), "hub")
  snaps = sorted(glob.glob(os.path.join(cache, f"{kind}--{name.replace('/', '--')}", "snapshots", "*")),
                 key=os.path.getmtime)
  return snaps[-1] if snaps else None


def fetch_command(repo: str) -> str:
  """The command that downloads `repo` to where `local_path` finds it."""
  name = repo.removeprefix("datasets/")
  kind = " --repo-type dataset" if repo.startswith("datasets/") else ""
  return f"hf download {name}{kind} --local-dir {os.path.join(models_dir(), repo)}"


def shipped(repo: str) -> str:
  """The path of the architecture this package ships for `repo` (it may not exist)."""
  return os.path.join(CONFIGS_DIR, repo.replace("/", "--") + ".json")


def architecture(ref: str) -> dict:
  """The config.json dict of checkpoint `ref`: a transformers directory, a `.gguf` file, or a repo id (downloaded,
  or else the architecture this package ships for it)."""
  ref = os.fspath(ref)
  if ref.endswith(".gguf") and os.path.isfile(ref):
    from jaxlab.hf import gguf
    reader = gguf.open_reader(ref)
    return gguf.config_dict(gguf.metadata(reader), [t.name for t in reader.tensors])
  path = local_path(ref) if is_repo_id(ref) else ref
  if path is not None and os.path.isfile(os.path.join(path, "config.json")):
    with open(os.path.join(path, "config.json")) as f:
      return json.load(f)
  if is_repo_id(ref) and os.path.isfile(shipped(ref)):
    with open(shipped(ref)) as f:
      return json.load(f)
  known = sorted(os.path.basename(p)[:-5].replace("--", "/") for p in glob.glob(os.path.join(CONFIGS_DIR, "*.json")))
  raise FileNotFoundError(f"no architecture for {ref!r}: expected a transformers directory with config.json, a .gguf "
                          f"file, or a repo id jaxlab ships ({', '.join(known)})")


def config(ref: str, dtype: str | None = None):
  """The jaxlab config of checkpoint `ref`'s architecture (`architecture`), `param_dtype` set to `dtype` if given."""
  from jaxlab.hf import family, whisper
  d = architecture(ref)
  if d.get("model_type") == "whisper":
    cfg = whisper.config_from_hf(d)
  else:
    cfg = family.by_model_type(d["model_type"]).for_checkpoint(d).config_from_hf(d)
  if dtype is not None and hasattr(cfg, "param_dtype"):
    cfg = cfg.replace(param_dtype=dtype)
  return cfg
