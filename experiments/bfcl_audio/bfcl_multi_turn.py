"""BFCL multi-turn checker (Berkeley Function Calling Leaderboard v4, experiments/bfcl_audio/README.md).

Each turn, the model's decoded calls and the ground-truth calls run on two separate sets of the `bfcl-eval` wheel's
stateful API classes (GorillaFileSystem, TwitterAPI, TradingBot, ...; imported from the installed package at run
time), created from the entry's `initial_config` and kept across turns. After every turn with ground-truth calls the
turn passes when (1) the model made at least one decodable call in it, (2) every public attribute of every
ground-truth instance equals the model instance's, and (3) the ground-truth results of the turn are contained, as a
multiset, in the results of all the model's calls so far. Turns without ground-truth calls are not checked, but the
model's calls in them still run, so later states see them.

Execution is restricted: a call is parsed with `ast` and runs only when it names a public method of an involved
class and its arguments are literals or such calls; nothing is `eval`ed. What the leaderboard evaluates beyond that
(arithmetic, builtins) here gives an "Error during execution" result. Results are text as on the leaderboard: a str
as is, a dict as JSON (else `str`), anything else `str`; an exception gives "Error during execution: <message>".
"""
from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from typing import Any, Mapping, NamedTuple, Sequence

from jaxlab import errors

# Method names the leaderboard refuses to call, whatever their class.
BLOCKED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")


class Verdict(NamedTuple):
  """A checker's verdict: `error_type` is the leaderboard's ("" when valid), `error` its messages."""
  valid: bool
  error_type: str = ""
  error: tuple = ()


OK = Verdict(True)


def require_bfcl_eval() -> str:
  """The installed bfcl_eval package directory; jaxlab.errors.MissingDependency when the wheel is absent."""
  return errors.package_dir("bfcl-eval", "BFCL (its data and API classes)")


def api_instances(entry: Mapping[str, Any]) -> dict[str, Any]:
  """Fresh instances of the entry's `involved_classes`, loaded with its `initial_config` (by class name)."""
  require_bfcl_eval()
  backend = importlib.import_module("bfcl_eval.constants.executable_backend_config")
  category = entry["id"].rsplit("_", 1)[0]
  long_context = "long_context" in category or "composite" in category
  out = {}
  for name in entry["involved_classes"]:
    if name not in backend.CLASS_FILE_PATH_MAPPING:
      raise ValueError(f"unknown BFCL API class {name!r}; expected one of {sorted(backend.CLASS_FILE_PATH_MAPPING)}")
    instance = getattr(importlib.import_module(backend.CLASS_FILE_PATH_MAPPING[name]), name)()
    if name not in backend.STATELESS_CLASSES:
      instance._load_scenario(copy.deepcopy(entry["initial_config"].get(name, {})), long_context=long_context)
    out[name] = instance
  return out


def public_methods(instances: Mapping[str, Any]) -> dict[str, Any]:
  """Method name -> bound method over the instances, in order (a later class wins a shared name)."""
  out = {}
  for instance in instances.values():
    for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
      if not name.startswith("_"):
        out[name] = method
  return out


def _value(node: ast.AST, methods: Mapping[str, Any]):
  if isinstance(node, ast.Call):
    return _call(node, methods)
  return ast.literal_eval(node)


def _call(node: ast.AST, methods: Mapping[str, Any]):
  if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
    raise ValueError(f"only calls of the API methods run; found {ast.unparse(node)!r}")
  name = node.func.id
  if name in BLOCKED:
    raise PermissionError(f"Function call {name} is not allowed.")
  if name not in methods:
    raise NameError(f"name {name!r} is not defined")
  if any(k.arg is None for k in node.keywords):
    raise ValueError(f"**kwargs are not executed; found {ast.unparse(node)!r}")
  args = [_value(a, methods) for a in node.args]
  return methods[name](*args, **{k.arg: _value(k.value, methods) for k in node.keywords})


def _as_text(result) -> str:
  if isinstance(result, str):
    return result
  if type(result) is dict:
    try:
      return json.dumps(result)
    except (TypeError, ValueError):
      return str(result)
  return str(result)


def execute(calls: Sequence[str], methods: Mapping[str, Any]) -> list[str]:
  """Runs each call string ("cd(folder='x')") on `methods`; one text result per call."""
  out = []
  for src in calls:
    try:
      out.append(_as_text(_call(ast.parse(src.strip(), mode="eval").body, methods)))
    except Exception as e:  # the call's own error is its result, as on the leaderboard
      out.append(f"Error during execution: {e}")
  return out


def _is_empty(steps: Sequence[Sequence[str]]) -> bool:
  return len(steps) == 0 or (len(steps) == 1 and len(steps[0]) == 0)


def _missing(expected: Sequence[str], got: Sequence[str]) -> list[str]:
  """The items of `expected` not in `got`, each item of `got` used at most once."""
  pool, missing = list(got), []
  for item in expected:
    if item in pool:
      pool.remove(item)
    else:
      missing.append(item)
  return missing


def check(model_turns: Sequence[Sequence[Sequence[str]]], ground_truth: Sequence[Sequence[str]],
          entry: Mapping[str, Any]) -> Verdict:
  """The leaderboard's multi-turn verdict.

  Args:
    model_turns: per turn, per step, the model's decoded call strings (steps that decoded to nothing left out).
    ground_truth: per turn, the ground-truth call strings (the possible_answer file's "ground_truth").
    entry: the question entry (`id`, `initial_config`, `involved_classes`).
  """
  if len(model_turns) != len(ground_truth):
    return Verdict(False, "multi_turn:force_terminated",
                   (f"model turns {len(model_turns)} != ground-truth turns {len(ground_truth)}",))
  model_methods = public_methods(model := api_instances(entry))
  truth_methods = public_methods(truth := api_instances(entry))
  model_results: list[str] = []
  for turn, (steps, truth_calls) in enumerate(zip(model_turns, ground_truth)):
    for step in steps:
      model_results += execute(step, model_methods)
    truth_results = execute(truth_calls, truth_methods)
    if not truth_calls:
      continue
    if _is_empty(steps):
      return Verdict(False, "multi_turn:empty_turn_model_response", (f"Model response list is empty for turn {turn}",))
    for name, instance in truth.items():
      diff = [k for k, v in vars(instance).items() if not k.startswith("_") and getattr(model[name], k) != v]
      if diff:
        return Verdict(False, "multi_turn:instance_state_mismatch",
                       (f"Model instance for {name} does not match the ground truth in {diff} after turn {turn}.",))
    if missing := _missing(truth_results, model_results):
      return Verdict(False, "multi_turn:execution_response_mismatch",
                     (f"ground-truth results of turn {turn} missing from the model's: {missing}",))
  return OK
