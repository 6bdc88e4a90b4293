"""The import layering of the README's Layout, checked on every import of every module (function-local ones included).

Layers, lowest first; a module imports only from its own layer or below (siblings in one layer may import
each other, but no two packages, and no two modules, import each other in a cycle):

  errors, choices, data, kernels, nn, sharding -> models -> losses, generate, hf, interp, adapters, optim, audio
    -> rl, envs, evals -> train -> experiments

`jaxlab/__init__.py` may re-export anything. No experiment module imports another one: experiments import
only the runner (`experiments.registry`, `experiments.runner`) and the shared helpers (`experiments._shared`);
the runner and the benchmarks (`experiments.bench*`) import no experiment either. A module of `jaxlab/` is
there because two or more experiments use it (directly or through other modules) or because it is public API,
named in the README's "Public API" section; what one paper alone uses lives in that paper's package.
"""
from __future__ import annotations

import ast
import os
import re
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPS = ("jaxlab", "kernels", "experiments")
LAYERS = (
    ("jaxlab.errors", "jaxlab.choices", "jaxlab.data", "kernels", "jaxlab.nn", "jaxlab.sharding"),
    ("jaxlab.models",),
    ("jaxlab.losses", "jaxlab.generate", "jaxlab.hf", "jaxlab.interp", "jaxlab.adapters", "jaxlab.optim",
     "jaxlab.audio"),
    ("jaxlab.rl", "jaxlab.envs", "jaxlab.evals"),
    ("jaxlab.train",),
    ("experiments",),
)
RANK = {unit: i for i, units in enumerate(LAYERS) for unit in units}
# What any module of experiments/ may import from it: the runner and the shared helpers.
RUNNER = ("registry", "runner")

# Known breaches awaiting a fix; each entry must disappear when its file is fixed (both lists are empty now)
# (a stale entry fails `test_known_breaches_still_exist`). (importer, imported) -> the fix.
KNOWN_UPWARD: dict = {}
KNOWN_CYCLES: dict = {}


def _modules() -> dict[str, str]:
  """Dotted module name -> file path, for every .py file under the packages of TOPS."""
  out = {}
  for top in TOPS:
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
      dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
      for f in sorted(filenames):
        if f.endswith(".py"):
          rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
          name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
          out[name] = os.path.join(dirpath, f)
  return out


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
  """(line, imported module) for every import in `source`, at any depth, relative ones resolved.

  `from X import y` counts as importing module X.y when that is a module of `known`, else X.
  """
  package = module if is_package else module.rpartition(".")[0]
  out = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        anchor = ".".join(parts[:len(parts) - node.level + 1])
        base = f"{anchor}.{base}" if base else anchor
      for a in node.names:
        sub = f"{base}.{a.name}"
        out.append((node.lineno, sub if sub in known else base))
  return sorted((line, m) for line, m in out if m.split(".")[0] in TOPS)


def unit(module: str) -> str:
  """The layered unit of a module: jaxlab.<package or module>, kernels, experiments, or jaxlab itself."""
  parts = module.split(".")
  if parts[0] == "jaxlab":
    return ".".join(parts[:2])
  return parts[0]


@pytest.fixture(scope="module")
def graph() -> dict[str, list[tuple[int, str]]]:
  mods = _modules()
  known = set(mods)
  out = {}
  for name, path in mods.items():
    with open(path) as f:
      out[name] = imports_of(f.read(), name, path.endswith("__init__.py"), known)
  return out


def _where(graph, src, dst) -> str:
  lines = [str(line) for line, m in graph[src] if m == dst]
  return f"{src.replace('.', '/')}.py:{','.join(lines)} imports {dst}"


def test_imports_of_resolves_relative_and_function_local_imports():
  src = textwrap.dedent("""
      import os
      from . import sibling
      from .. import models
      from ..models import transformer as tfm, not_a_module
      def f():
        from jaxlab.train.step import next_token_nll
        import kernels.spec_verify
      """)
  known = {"jaxlab.hf.sibling", "jaxlab.models", "jaxlab.models.transformer", "jaxlab.train.step"}
  got = [m for _, m in imports_of(src, "jaxlab.hf.x", False, known)]
  assert got == ["jaxlab.hf.sibling", "jaxlab.models", "jaxlab.models", "jaxlab.models.transformer",
                 "jaxlab.train.step", "kernels.spec_verify"]
  assert [m for _, m in imports_of("from . import io", "jaxlab.hf", True, {"jaxlab.hf.io"})] == ["jaxlab.hf.io"]


def test_every_module_has_a_layer(graph):
  missing = sorted({unit(m) for m in graph if unit(m) != "jaxlab" and unit(m) not in RANK})
  assert not missing, f"add these to LAYERS in tests/test_layering.py and the README's Layout: {missing}"


def _upward(graph) -> dict[tuple[str, str], str]:
  out = {}
  for src, deps in graph.items():
    if unit(src) == "jaxlab":  # jaxlab/__init__.py re-exports
      continue
    for _, dst in deps:
      if unit(dst) != "jaxlab" and RANK.get(unit(dst), -1) > RANK.get(unit(src), -1):
        out[(src, dst)] = _where(graph, src, dst)
  return out


def test_imports_go_down_the_layers(graph):
  bad = {k: v for k, v in _upward(graph).items() if k not in KNOWN_UPWARD}
  assert not bad, "upward imports (a module imports only from its own layer or below):\n" + "\n".join(
      f"  {v} (layer {RANK[unit(k[1])]} above {RANK[unit(k[0])]})" for k, v in sorted(bad.items()))


def _cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
  """Strongly connected components with more than one node (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = set()
      while True:
        w = stack.pop()
        on.discard(w)
        comp.add(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(frozenset(comp))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return out


def test_no_package_imports_a_sibling_that_imports_it_back(graph):
  edges: dict[str, set[str]] = {}
  for src, deps in graph.items():
    for _, dst in deps:
      if unit(src) != unit(dst) and "jaxlab" not in (unit(src), unit(dst)) and (src, dst) not in KNOWN_UPWARD:
        edges.setdefault(unit(src), set()).add(unit(dst))
  assert not _cycles(edges), f"import cycles between packages: {[sorted(c) for c in _cycles(edges)]}"


def _module_edges(graph) -> dict[str, set[str]]:
  """Module -> the modules of the tree it imports (a known upward breach left out: it is reported once)."""
  return {src: {dst for _, dst in deps if dst in graph and dst != src and (src, dst) not in KNOWN_UPWARD}
          for src, deps in graph.items()}


def test_no_module_import_cycles(graph):
  edges = _module_edges(graph)
  bad = [c for c in _cycles(edges) if c not in KNOWN_CYCLES]
  assert not bad, "module import cycles (a submodule importing its own package's __init__, or A <-> B):\n" + (
      "\n".join(f"  {sorted(c)}" for c in bad))


def _runner_or_shared(module: str) -> bool:
  """experiments (the package), its runner, or the shared helpers (experiments._shared)."""
  leaf = module.split(".")[1] if "." in module else ""
  return not leaf or leaf in RUNNER or leaf == "_shared"


def test_no_experiment_imports_another_experiment(graph):
  bad = []
  for src, deps in graph.items():
    if unit(src) != "experiments":
      continue
    for _, dst in deps:
      same_package = "." in src and src.split(".")[:2] == dst.split(".")[:2]  # experiments/<paper>/ modules
      if unit(dst) == "experiments" and not _runner_or_shared(dst) and not same_package:
        bad.append(_where(graph, src, dst))
  assert not bad, ("experiments import only experiments.registry and shared helpers (experiments/_shared/):\n  "
                   + "\n  ".join(sorted(set(bad))))


def test_known_breaches_still_exist(graph):
  """The temporary allow-lists only shrink: an entry whose breach is gone must be deleted."""
  up = _upward(graph)
  stale = [k for k in KNOWN_UPWARD if k not in up]
  edges = _module_edges(graph)
  cycles = set(_cycles(edges))
  stale += [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
  assert not stale, f"fixed breaches still listed in KNOWN_UPWARD / KNOWN_CYCLES; delete them: {stale}"


def _closure(graph, module: str, seen: set[str]) -> set[str]:
  """The modules of the tree that importing `module` runs (an import of a.b.c runs a and a.b too)."""
  for _, dst in graph.get(module, ()):
    parts = dst.split(".")
    for i in range(1, len(parts) + 1):
      m = ".".join(parts[:i])
      if m in graph and m not in seen:
        seen.add(m)
        _closure(graph, m, seen)
  return seen


def _public_api() -> set[str]:
  """The dotted module names written in the README's "Public API" section."""
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  section = text.split("\n## Public API", 1)[1].split("\n## ", 1)[0]
  return set(re.findall(r"jaxlab(?:\.\w+)+", section))


def test_every_library_module_is_shared_or_public(graph):
  users: dict[str, set[str]] = {}
  for src in graph:
    parts = src.split(".")
    if parts[0] == "experiments" and len(parts) > 1 and not _runner_or_shared(src) and parts[1] != "__main__":
      for m in _closure(graph, src, {src}):
        users.setdefault(m, set()).add(parts[1])
  public = _public_api()
  lonely = {m: sorted(users.get(m, ())) for m in graph
            if unit(m) not in ("jaxlab", "kernels") and m.startswith("jaxlab.") and len(users.get(m, ())) < 2
            and m not in public and not any(m.startswith(p + ".") for p in public)}
  assert not lonely, ("jaxlab modules used by fewer than two experiments and not named in the README's Public API "
                      "(move them into their paper's package, or name them there):\n  " + "\n  ".join(
                          f"{m}: {u or 'no experiment'}" for m, u in sorted(lonely.items())))
