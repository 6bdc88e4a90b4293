"""BFCL checker ("bfcl_audio"): verdicts and error types against the leaderboard's own checker (bfcl-eval 2026.3.23's
ast_checker / multi_turn_checker / prompt decoder, run beside ours) on hand-made cases and on the wheel's data with
perturbed outputs; the strict mode diverges exactly on its three named fixes."""
import ast
import collections
import copy
import itertools
import json
import random
import sys
import types

import pytest

bfcl_eval = pytest.importorskip("bfcl_eval")

from jaxlab import errors  # noqa: E402
from experiments.bfcl_audio import bfcl
from experiments.bfcl_audio import bfcl_multi_turn

DOT_MODEL, PLAIN_MODEL = "gpt-5.2-2025-12-11-FC", "gorilla-openfunctions-v2"  # underscore_to_dot True / False


@pytest.fixture(scope="module")
def lb():
  """The leaderboard's checker modules. bfcl_eval.constants.model_config imports every API handler (anthropic,
  openai, mistralai, cohere, google-genai, boto3, qwen-agent, writer-sdk, ...); the checker reads only its
  `underscore_to_dot` flag, so when those SDKs are absent that one table is given for the two models used here."""
  with pytest.MonkeyPatch.context() as mp:
    try:
      import bfcl_eval.constants.model_config  # noqa: F401 (the real table, when its SDKs are installed)
    except ModuleNotFoundError:
      table = types.ModuleType("bfcl_eval.constants.model_config")
      table.MODEL_CONFIG_MAPPING = {DOT_MODEL: types.SimpleNamespace(underscore_to_dot=True),
                                    PLAIN_MODEL: types.SimpleNamespace(underscore_to_dot=False)}
      mp.setitem(sys.modules, "bfcl_eval.constants.model_config", table)
      mp.delitem(sys.modules, "bfcl_eval.eval_checker.ast_eval.ast_checker", raising=False)
    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker.ast_eval import ast_checker
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker
    from bfcl_eval import utils
    decoder = pytest.importorskip("bfcl_eval.model_handler.utils")  # needs tree_sitter and tenacity
    yield types.SimpleNamespace(ast=ast_checker, mt=multi_turn_checker, utils=utils, decoder=decoder,
                                lang={"python": Language.PYTHON, "java": Language.JAVA,
                                      "javascript": Language.JAVASCRIPT}, fmt=ReturnFormat)


def _oracle(lb, functions, output, possible, language, category, dot=False):
  """The leaderboard's pipeline on one output: prompt decoding (text), format check, ast_checker."""
  if isinstance(output, str):
    try:
      output = lb.decoder.default_decode_ast_prompting(output, lb.fmt.PYTHON)
    except Exception:
      return False, "ast_decoder:decoder_failed"
  if not lb.utils.is_function_calling_format_output(output):
    return False, "ast_decoder:decoder_wrong_output_format"
  r = lb.ast.ast_checker(copy.deepcopy(functions), copy.deepcopy(output), copy.deepcopy(possible), lb.lang[language],
                         category, DOT_MODEL if dot else PLAIN_MODEL)
  return r["valid"], r.get("error_type", "") if not r["valid"] else ""


def _ours(functions, output, possible, language, category, dot=False, mode="leaderboard"):
  v = bfcl.ast_check(copy.deepcopy(functions), copy.deepcopy(output), copy.deepcopy(possible), language=language,
                     test_category=category, underscore_to_dot=dot, mode=mode)
  return v.valid, v.error_type


def _fn(name, props, required=None):
  return {"name": name, "parameters": {"type": "dict", "properties": props,
                                       "required": list(props) if required is None else required}}


I, S, F, B = {"type": "integer"}, {"type": "string"}, {"type": "float"}, {"type": "boolean"}
AREA = _fn("geo.area", {"base": I, "height": F, "unit": S}, ["base", "height"])
AREA_PA = [{"geo.area": {"base": [10], "height": [5.0], "unit": ["units", ""]}}]
PY = [  # (functions, output, possible answer, category, expected error type)
    ([AREA], [{"geo.area": {"base": 10, "height": 5}}], AREA_PA, "simple", ""),
    ([AREA], [{"geo.area": {"base": 10, "height": 5.0, "unit": "U-nits "}}], AREA_PA, "simple", ""),
    ([AREA], "geo.area(base=10, height=5)", AREA_PA, "simple", ""),
    ([AREA], "[geo.area(base=10, height=5), geo.area(base=10, height=5)]", AREA_PA, "simple",
     "simple_function_checker:wrong_count"),
    ([AREA], "geo.area(base=10, height=", AREA_PA, "simple", "ast_decoder:decoder_failed"),
    ([AREA], "[1, 2]", AREA_PA, "simple", "ast_decoder:decoder_failed"),
    ([AREA], [{"geo.area": [10]}], AREA_PA, "simple", "ast_decoder:decoder_wrong_output_format"),
    ([AREA], [{"geo.volume": {"base": 10, "height": 5}}], AREA_PA, "simple", "simple_function_checker:wrong_func_name"),
    ([AREA], [{"geo.area": {"base": 10}}], AREA_PA, "simple", "simple_function_checker:missing_required"),
    ([AREA], [{"geo.area": {"base": 10, "height": 5, "depth": 1}}], AREA_PA, "simple",
     "simple_function_checker:unexpected_param"),
    ([AREA], [{"geo.area": {"base": 10.5, "height": 5}}], AREA_PA, "simple", "type_error:simple"),
    ([AREA], [{"geo.area": {"base": True, "height": 5}}], AREA_PA, "simple", "type_error:simple"),
    ([AREA], [{"geo.area": {"base": 11, "height": 5}}], AREA_PA, "simple", "value_error:others"),
    ([AREA], [{"geo.area": {"base": 10, "height": 5, "unit": "cm"}}], AREA_PA, "simple", "value_error:string"),
    ([AREA], [{"geo.area": {"base": 10, "height": 5}}], [{"geo.area": {"base": [10], "height": [5.0], "unit": ["m"]}}],
     "simple", "simple_function_checker:missing_optional"),
    ([AREA], [{"geo.area": {"base": "b", "height": 5}}], [{"geo.area": {"base": ["b"], "height": [5.0]}}], "simple",
     ""),  # a variable: the possible answer's type (str), not the schema's
    ([_fn("f", {"xs": {"type": "array", "items": I}})], [{"f": {"xs": [1, 2]}}], [{"f": {"xs": [[1, 2]]}}], "simple",
     ""),
    ([_fn("f", {"xs": {"type": "array", "items": I}})], [{"f": {"xs": [1, "2"]}}], [{"f": {"xs": [[1, 2]]}}],
     "simple", "type_error:nested"),
    ([_fn("f", {"xs": {"type": "array", "items": S}})], [{"f": {"xs": ["New York", "b"]}}],
     [{"f": {"xs": [["new york", "B"]]}}], "simple", ""),
    ([_fn("f", {"xs": {"type": "array", "items": I}})], [{"f": {"xs": [2, 1]}}], [{"f": {"xs": [[1, 2]]}}], "simple",
     "value_error:list/tuple"),
    ([_fn("f", {"xs": {"type": "tuple", "items": I}})], "f(xs=(1, 2))", [{"f": {"xs": [[1, 2]]}}], "simple", ""),
    ([_fn("f", {"d": {"type": "dict"}})], [{"f": {"d": {"a": "X y", "b": 1}}}], [{"f": {"d": [{"a": ["x_y"],
                                                                                              "b": [1]}]}}],
     "simple", ""),
    ([_fn("f", {"d": {"type": "dict"}})], [{"f": {"d": {"a": "x", "c": 1}}}], [{"f": {"d": [{"a": ["x"], "b": [1]}]}}],
     "simple", "value_error:dict_key"),
    ([_fn("f", {"d": {"type": "dict"}})], [{"f": {"d": {"a": "y", "b": 1}}}], [{"f": {"d": [{"a": ["x"], "b": [1]}]}}],
     "simple", "value_error:dict_value"),
    ([_fn("f", {"d": {"type": "dict"}})], [{"f": {"d": {"a": "y"}}}], [{"f": {"d": [{"a": ["x"], "b": [1]}]}}],
     "simple", "value_error:dict_key"),  # a wrong value and a missing key: the missing key is reported
    ([_fn("f", {"d": {"type": "array", "items": {"type": "dict"}}})], [{"f": {"d": [{"a": 1}]}}],
     [{"f": {"d": [[{"a": [1]}, {"a": [2]}]]}}], "simple", "value_error:list_dict_count"),
    ([_fn("f", {"d": {"type": "array", "items": {"type": "dict"}}})], [{"f": {"d": [{"a": 1}, {"a": 3}]}}],
     [{"f": {"d": [[{"a": [1]}, {"a": [2]}]]}}], "simple", "value_error:dict_value"),
    ([AREA, _fn("g", {"x": I})], [{"g": {"x": 1}}], [{"g": {"x": [1]}}], "multiple", ""),
    ([AREA, _fn("g", {"x": I})], [{"g": {"x": 1}}, {"g": {"x": 1}}], [{"g": {"x": [1]}}], "multiple",
     "multiple_function_checker:wrong_count"),
    ([AREA, _fn("g", {"x": I})], [{"geo.area": {"base": 10, "height": 5}}], [{"g": {"x": [1]}}], "multiple",
     "simple_function_checker:wrong_func_name"),
    ([_fn("g", {"x": I})], "[g(x=2), g(x=1)]", [{"g": {"x": [1]}}, {"g": {"x": [2]}}], "parallel", ""),
    ([_fn("g", {"x": I})], "[g(x=2)]", [{"g": {"x": [1]}}, {"g": {"x": [2]}}], "parallel",
     "parallel_function_checker_no_order:wrong_count"),
    ([_fn("g", {"x": I})], "[g(x=2), g(x=3)]", [{"g": {"x": [1]}}, {"g": {"x": [2]}}], "parallel",
     "parallel_function_checker_no_order:cannot_find_match"),
    ([AREA, _fn("g", {"x": I})], "[g(x=1), geo.area(base=10, height=5.0)]", AREA_PA + [{"g": {"x": [1]}}],
     "parallel_multiple", ""),
]
JAVA_FN = _fn("Db.query", {"n": I, "big": {"type": "long"}, "ok": B, "name": {"type": "String"},
                           "ids": {"type": "ArrayList", "items": {"type": "integer"}}, "opts": {"type": "HashMap"},
                           "rate": {"type": "float"}, "obj": {"type": "any"}}, ["n"])
JAVA_PA = [{"Db.query": {"n": [5], "big": [7, ""], "ok": [True, ""], "name": ["users", ""], "ids": [[1, 2], ""],
                         "opts": [{"k": ["v"]}, ""], "rate": [0.5, ""], "obj": ["myObj", ""]}}]
JAVA = [
    ({"n": "5", "big": "7L", "ok": "true", "name": "users", "ids": "new ArrayList<>(Arrays.asList(1, 2))",
      "opts": 'new HashMap<String, String>() {{ put("k", "v"); }}', "rate": "0.5f", "obj": "myObj"}, ""),
    ({"n": "5", "ids": "new ArrayList<Integer>() {{ add(1); add(2); }}"}, ""),
    ({"n": 5}, "type_error:java"),
    ({"n": "6"}, "value_error:others"),
    ({"n": "five"}, "type_error:simple"),
    ({"n": "5", "big": "7"}, "type_error:simple"),  # a long needs its L
    ({"n": "5", "rate": "0.5"}, "type_error:simple"),  # a float needs its f
    ({"n": "5", "ok": "True"}, "type_error:simple"),
    ({"n": "5", "name": "user"}, "value_error:string"),
    ({"n": "5", "ids": "new ArrayList<>(Arrays.asList(2, 1))"}, "value_error:list/tuple"),
    ({"n": "5", "ids": "[1, 2]"}, "type_error:simple"),
    ({"n": "5", "opts": 'new HashMap<String, String>() {{ put("k", "w"); }}'}, "value_error:dict_value"),
    ({"n": "5", "obj": "otherObj"}, "value_error:string"),
]
JS_FN = _fn("sendData", {"url": {"type": "String"}, "n": I, "big": {"type": "Bigint"}, "ok": {"type": "Boolean"},
                         "tags": {"type": "array", "items": {"type": "String"}}, "cfg": {"type": "dict"},
                         "w": F, "cb": {"type": "any"}}, ["url"])
JS_PA = [{"sendData": {"url": ["http://a.b"], "n": [3, ""], "big": [9, ""], "ok": [False, ""], "tags": [["x", "y"], ""],
                       "cfg": [{"retry": [True], "mode": ["fast"]}, ""], "w": [1.5, ""], "cb": ["done", ""]}}]
JS = [
    ({"url": "'http://a.b'", "n": "3", "big": "9n", "ok": "false", "tags": "['x', 'y']",
      "cfg": "{retry: true, mode: 'fast'}", "w": "1.5", "cb": "done"}, ""),
    ({"url": "http://A.B", "tags": 'new Array("x", "y")'}, ""),
    ({"url": 1}, "type_error:js"),
    ({"url": "'http://c.d'"}, "value_error:string"),
    ({"url": "'http://a.b'", "big": "9"}, "type_error:simple"),
    ({"url": "'http://a.b'", "n": "3.5"}, "type_error:simple"),
    ({"url": "'http://a.b'", "tags": "['y', 'x']"}, "value_error:list/tuple"),
    ({"url": "'http://a.b'", "cfg": "{retry: true, mode: 'slow'}"}, "value_error:dict_value"),
    ({"url": "'http://a.b'", "cfg": "{retry: true}"}, "value_error:dict_key"),
    ({"url": "'http://a.b'", "w": "2"}, "value_error:others"),
]
CASES = ([(f, o, p, "python", c, e) for f, o, p, c, e in PY]
         + [([JAVA_FN], [{"Db.query": o}], JAVA_PA, "java", "simple_java", e) for o, e in JAVA]
         + [([JS_FN], [{"sendData": o}], JS_PA, "javascript", "simple_javascript", e) for o, e in JS])


@pytest.mark.parametrize("functions,output,possible,language,category,expected", CASES)
def test_hand_made_cases_match_the_leaderboard(lb, functions, output, possible, language, category, expected):
  ours = _ours(functions, output, possible, language, category)
  assert ours == _oracle(lb, functions, output, possible, language, category)
  assert ours == (expected == "", expected)
  assert ours == _ours(functions, output, possible, language, category, mode="strict")  # none of the three quirks


def test_hand_made_cases_cover_every_single_turn_error_type():
  assert {e for *_, e in CASES} - {""} == {
      "ast_decoder:decoder_failed", "ast_decoder:decoder_wrong_output_format", "simple_function_checker:wrong_count",
      "simple_function_checker:wrong_func_name", "simple_function_checker:missing_required",
      "simple_function_checker:unexpected_param", "simple_function_checker:missing_optional", "type_error:simple",
      "type_error:nested", "type_error:java", "type_error:js", "value_error:others", "value_error:string",
      "value_error:list/tuple", "value_error:dict_key", "value_error:dict_value", "value_error:list_dict_count",
      "multiple_function_checker:wrong_count", "parallel_function_checker_no_order:wrong_count",
      "parallel_function_checker_no_order:cannot_find_match"}


@pytest.mark.parametrize("dot", [False, True])
def test_underscore_to_dot_renames_expected_names(lb, dot):
  for name in ("geo_area", "geo.area"):
    out = [{name: {"base": 10, "height": 5}}]
    assert _ours([AREA], out, AREA_PA, "python", "simple", dot) == _oracle(lb, [AREA], out, AREA_PA, "python",
                                                                           "simple", dot)
  assert _ours([AREA], [{"geo_area": {"base": 10, "height": 5}}], AREA_PA, "python", "simple", dot)[0] == dot


# ---- the wheel's possible answers, rendered as outputs and perturbed ----

def _first(options):
  if not isinstance(options, list):  # a few possible answers give a dict key one bare value
    return options
  return next((o for o in options if o != ""), "")


def _concrete(value):
  """A value of a possible answer: dicts hold per-key possible values, of which the first given one is taken."""
  if isinstance(value, dict):
    return {k: _concrete(_first(vs)) for k, vs in value.items() if _first(vs) != ""}
  if isinstance(value, list):
    return [_concrete(v) for v in value]
  return value


def _java_literal(v, kind, item=None):
  if not isinstance(v, (list, dict, bool, int, float)) or kind in ("String", "any", "char"):
    return str(v)
  if kind == "boolean" or isinstance(v, bool):
    return "true" if v else "false"
  if kind == "long":
    return f"{v}L"
  if kind == "float":
    return f"{v}f"
  if kind in ("Array", "ArrayList") and isinstance(v, list):
    items = [f'"{x}"' if item in ("String", "char") else _java_literal(x, item) for x in v]
    if kind == "Array":
      return f"new {item or 'Object'}[]{{{', '.join(items)}}}"
    return f"new ArrayList<>(Arrays.asList({', '.join(items)}))"
  if kind == "HashMap" and isinstance(v, dict):
    puts = " ".join(f'put("{k}", {json.dumps(x) if isinstance(x, str) else _java_literal(x, None)});'
                    for k, x in v.items())
    return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
  return str(v)


def _js_literal(v, kind, item=None):
  if isinstance(v, bool):
    return "true" if v else "false"
  if kind == "Bigint" and isinstance(v, int):
    return f"{v}n"
  if kind == "String" and isinstance(v, str):
    return f"'{v}'"
  if isinstance(v, list):
    return "[" + ", ".join(_js_literal(x, item) for x in v) + "]"
  if isinstance(v, dict):
    items = (f"{k}: {_js_literal(x, 'String' if isinstance(x, str) else None)}" for k, x in v.items())
    return "{" + ", ".join(items) + "}"
  return str(v)


def _render(functions, calls, language):
  """[{name: {param: python value}}] -> the output a model of `language` gives (literal strings for Java / JS)."""
  if language == "python":
    return [{n: {p: v.value if isinstance(v, Raw) else v for p, v in a.items()}} for c in calls for n, a in c.items()]
  schemas = {f["name"]: f["parameters"]["properties"] for f in functions}
  literal = _java_literal if language == "java" else _js_literal
  out = []
  for call in calls:
    (name, params), = call.items()
    sch = schemas.get(name, {})
    out.append({name: {p: v.value if isinstance(v, Raw) else
                       literal(v, sch[p]["type"], sch[p].get("items", {}).get("type")) if p in sch else str(v)
                       for p, v in params.items()}})
  return out


class Raw:
  """A value given as is (not as a literal string) to a Java / JavaScript checker."""

  def __init__(self, value):
    self.value = value


def _perturb(kind, calls, functions, rng):
  """One perturbed copy of the ground-truth calls (None when the perturbation does not apply)."""
  calls = copy.deepcopy(calls)
  if kind == "truth":
    return calls
  if kind == "swap":
    return calls[::-1] if len(calls) > 1 and calls[0] != calls[-1] else None
  i = rng.randrange(len(calls))
  (name, params), = calls[i].items()
  schema = next(f for f in functions if f["name"] == name)["parameters"]
  if kind == "wrong_function":
    calls[i] = {name + "_v2": params}
    return calls
  if kind == "extra_param":
    params["zz_extra"] = 1
    return calls
  if kind == "missing_param":
    present = [p for p in schema["required"] if p in params] or list(params)
    if not present:
      return None
    del params[rng.choice(present)]
    return calls
  if not params:
    return None
  p = rng.choice(sorted(params))
  v = params[p]
  if kind == "wrong_type":
    params[p] = str(v) if not isinstance(v, str) else Raw(12345)
  elif kind == "wrong_value":
    if isinstance(v, bool):
      params[p] = not v
    elif isinstance(v, (int, float)):
      params[p] = v + 1
    elif isinstance(v, str):
      params[p] = v + " zzz"
    elif isinstance(v, list):
      params[p] = v + v[:1] if v else [1]
    elif isinstance(v, dict):
      params[p] = {**v, "zz_key": 1}
  return calls


KINDS = ("truth", "wrong_value", "missing_param", "extra_param", "wrong_type", "wrong_function", "swap")


def _truth(possible):
  """The ground-truth calls: each parameter's first given possible value (parameters that may be omitted, omitted
  when "" is all they allow)."""
  return [{name: _concrete({p: [_first(vs)] for p, vs in params.items() if _first(vs) != ""})}
          for call in possible for name, params in call.items()]


def _wheel_cases():
  """Every entry of every AST category of the wheel, as its ground truth and each applicable perturbation."""
  rng = random.Random(0)
  for category in bfcl.AST_CATEGORIES:
    questions, answers = bfcl.load(category)
    language = bfcl.language_of(category)
    for q in questions:
      possible = answers[q["id"]]["ground_truth"]
      for kind in KINDS:
        calls = _perturb(kind, _truth(possible), q["function"], rng)
        if calls is not None:
          yield category, q["id"], kind, q["function"], _render(q["function"], calls, language), possible, language


@pytest.fixture(scope="module")
def wheel(lb):
  """(case, oracle verdict, leaderboard-mode verdict, strict verdict) over the sampled wheel cases."""
  rows = []
  for case in _wheel_cases():
    category, _, _, functions, output, possible, language = case
    try:
      expected = _oracle(lb, functions, output, possible, language, category)
    except Exception as e:  # the leaderboard itself fails on this input (e.g. a type outside its tables)
      expected = type(e)
    got = []
    for mode in bfcl.MODES:
      try:
        got.append(_ours(functions, output, possible, language, category, mode=mode))
      except Exception as e:
        got.append(type(e))
    rows.append((case, expected, *got))
  return rows


def test_wheel_perturbations_match_the_leaderboard(wheel):
  mismatches = [(c[:3], e, g) for c, e, g, _ in wheel if not (e == g or (isinstance(e, type) and isinstance(g, type)))]
  assert not mismatches, mismatches[:5]
  kinds = {(c[2], e[1]) for c, e, *_ in wheel if not isinstance(e, type)}
  assert len(wheel) > 15000 and len({k for k, _ in kinds}) == len(KINDS)
  assert len({t for _, t in kinds}) >= 12  # the perturbations reach many error types


def test_wheel_ground_truth_passes(wheel):
  for category in bfcl.AST_CATEGORIES:
    truth = [e for c, e, *_ in wheel if c[0] == category and c[2] == "truth"]
    rate = sum(isinstance(e, tuple) and e[0] for e in truth) / len(truth)
    assert rate >= (0.85 if category == "simple_java" else 0.98), (category, rate)
    strict = [s for c, _, _, s in wheel if c[0] == category and c[2] == "truth"]
    assert sum(isinstance(s, tuple) and s[0] for s in strict) / len(strict) >= 0.95, category


def _quirks(case):
  """The named strict-mode fixes that can touch a case."""
  category, _, _, functions, _, _, language = case
  kinds = {(s["type"], s.get("items", {}).get("type"))
           for f in functions for s in f["parameters"]["properties"].values()}
  out = set()
  if "parallel" in category:
    out.add("bipartite")
  if any(t == "dict" or i == "dict" or t == "HashMap" for t, i in kinds):
    out.add("dict_types")
  if language == "java" and any(t == "Array" and i in ("String", "char") for t, i in kinds):
    out.add("java_string_array")
  return out


def test_strict_mode_diverges_only_on_the_named_fixes(wheel):
  diverging = [c for c, _, g, s in wheel if g != s]
  assert diverging and all(_quirks(c) for c in diverging), [c[:3] for c in diverging if not _quirks(c)]
  assert any("java_string_array" in _quirks(c) for c in diverging)


def test_strict_bipartite_parallel_matching(lb):
  functions = [_fn("g", {"x": I})]
  possible = [{"g": {"x": [1, 2]}}, {"g": {"x": [1]}}]
  out = "[g(x=1), g(x=2)]"  # greedy: the first expected call takes x=1, which the second one needed
  assert _ours(functions, out, possible, "python", "parallel") == _oracle(lb, functions, out, possible, "python",
                                                                         "parallel")
  assert _ours(functions, out, possible, "python", "parallel") == (
      False, "parallel_function_checker_no_order:cannot_find_match")
  assert _ours(functions, out, possible, "python", "parallel", mode="strict") == (True, "")
  out = "[g(x=2), g(x=1)]"
  assert _ours(functions, out, possible, "python", "parallel") == _ours(functions, out, possible, "python", "parallel",
                                                                        mode="strict") == (True, "")


def test_greedy_matching_fails_a_correct_wheel_answer(lb):
  """parallel_178: the first expected call accepts Microsoft or Apple on 2022-01-01, so greedy matching gives it
  Apple's call, which the third expected call needed."""
  questions, answers = bfcl.load("parallel")
  q = next(q for q in questions if q["id"] == "parallel_178")
  possible = answers[q["id"]]["ground_truth"]
  out = [{"get_stock_price": {"company_name": c, "date": d}} for c in ("Apple", "Microsoft")
         for d in ("2022-02-01", "2022-01-01")]
  assert _ours(q["function"], out, possible, "python", "parallel") == _oracle(lb, q["function"], out, possible,
                                                                             "python", "parallel") == (
      False, "parallel_function_checker_no_order:cannot_find_match")
  assert _ours(q["function"], out, possible, "python", "parallel", mode="strict") == (True, "")
  assert _ours(q["function"], out[::-1], possible, "python", "parallel") == (True, "")


def test_strict_brute_force_matching_on_random_parallel_cases():
  """Strict parallel verdict == some permutation of the calls matches every expected call (brute force)."""
  rng = random.Random(1)
  functions = [_fn("g", {"x": I})]
  for _ in range(200):
    n = rng.randint(1, 4)
    possible = [{"g": {"x": rng.sample(range(4), rng.randint(1, 3))}} for _ in range(n)]
    out = [{"g": {"x": rng.randrange(4)}} for _ in range(n)]
    brute = any(all(c["g"]["x"] in e["g"]["x"] for c, e in zip(perm, possible)) for perm in itertools.permutations(out))
    assert _ours(functions, out, possible, "python", "parallel", mode="strict")[0] == brute


@pytest.mark.parametrize("value,possible,strict", [
    ({"a": True}, {"a": [1]}, (False, "value_error:dict_value")),
    ({"a": 1.0}, {"a": [True]}, (False, "value_error:dict_value")),
    ({"a": 1}, {"a": [1.0]}, (True, "")),  # int for float, as for parameters
])
def test_strict_dict_value_types(lb, value, possible, strict):
  for kind, out, pa in [("dict", value, [possible]), ("array", [value], [[possible]])]:
    schema = {"type": kind, "items": {"type": "dict"}} if kind == "array" else {"type": "dict"}
    functions, output, answer = [_fn("f", {"d": schema})], [{"f": {"d": out}}], [{"f": {"d": pa}}]
    assert _ours(functions, output, answer, "python", "simple") == _oracle(lb, functions, output, answer, "python",
                                                                           "simple") == (True, "")
    assert _ours(functions, output, answer, "python", "simple", mode="strict") == strict


def test_strict_java_string_array_literals(lb):
  functions = [_fn("Foo.bar", {"names": {"type": "Array", "items": {"type": "String"}},
                               "cs": {"type": "Array", "items": {"type": "char"}}}, [])]
  for param, literal, answer in [("names", 'new String[]{"a", "b c"}', ["a", "b c"]), ("cs", "new char[]{'x', 'y'}",
                                                                                     ["x", "y"])]:
    decoded = lb.decoder.default_decode_ast_prompting(f"[Foo.bar({param}={literal})]", lb.fmt.JAVA)
    possible = [{"Foo.bar": {param: [answer]}}]
    leaderboard = _ours(functions, decoded, possible, "java", "simple_java")
    assert leaderboard == _oracle(lb, functions, decoded, possible, "java", "simple_java")
    assert leaderboard == (False, "value_error:list/tuple")
    assert _ours(functions, decoded, possible, "java", "simple_java", mode="strict") == (True, "")


def _relevance_oracle(lb, output, category):
  try:
    decoded = lb.decoder.default_decode_ast_prompting(output, lb.fmt.PYTHON) if isinstance(output, str) else output
    has_call = not lb.utils.is_empty_output(decoded)
  except Exception:
    has_call = False
  return has_call != ("irrelevance" in category)


@pytest.mark.parametrize("output", ["", "I cannot answer that.", "[]", "[{}]", "get_weather(city='Paris')",
                                    "[f(a=1), g()]", "```\n[f(x=1)]\n```", "f(1)", [], [{"f": {"a": 1}}],
                                    [{"name": "f", "arguments": "{\"a\": 1}"}]])
@pytest.mark.parametrize("category", ["irrelevance", "live_irrelevance", "live_relevance"])
def test_relevance_matches_the_leaderboard(lb, output, category):
  v = bfcl.relevance_check(copy.deepcopy(output), test_category=category)
  expected_type = "irrelevance_error:decoder_success" if "irrelevance" in category else "relevance_error:decoder_failed"
  if not isinstance(output, list) or output in ([], [{"f": {"a": 1}}]):  # the oracle takes text or decoded calls
    assert v.valid == _relevance_oracle(lb, output, category)
  assert v.error_type == ("" if v.valid else expected_type)
  assert v.valid == (("irrelevance" in category) == (output in ("", "I cannot answer that.", "[]", "[{}]", [])))


def test_fc_and_prompt_outputs_decode_alike(lb):
  functions, possible = [AREA], AREA_PA
  outs = ["geo.area(base=10, height=5)", [{"geo.area": {"base": 10, "height": 5}}],
          [{"geo.area": '{"base": 10, "height": 5}'}], [{"name": "geo.area", "arguments": '{"base": 10, "height": 5}'}],
          json.dumps([{"name": "geo.area", "arguments": {"base": 10, "height": 5}}])]
  assert {_ours(functions, o, possible, "python", "simple") for o in outs[:-1]} == {(True, "")}
  assert bfcl.decode_fc(outs[-1]) == outs[1]
  text = "[f(a=-1, b=2*3+1, c=x, d=g(1), e=h(k=2), s=y[0], t=(1, 'p'), u={'k': [True, None]})]"
  assert bfcl.decode_prompt(text) == lb.decoder.default_decode_ast_prompting(text, lb.fmt.PYTHON)
  assert bfcl.decode_execute(text) == lb.decoder.default_decode_execute_prompting(text)


@pytest.mark.parametrize("bad,match", [
    (dict(language="rust"), "language must be one of"), (dict(mode="lenient"), "mode must be one of"),
    (dict(language="java", output="Foo.bar(n=1)"), "decoded for Python only"),
])
def test_bad_input_is_named(bad, match):
  with pytest.raises(ValueError, match=match):
    bfcl.ast_check([AREA], bad.get("output", []), AREA_PA, language=bad.get("language", "python"),
                   test_category="simple", mode=bad.get("mode", "leaderboard"))
  with pytest.raises(ValueError, match="unsupported Python type 'number'"):
    bfcl.ast_check([_fn("f", {"x": {"type": "number"}})], [{"f": {"x": 1}}], [{"f": {"x": [1]}}], language="python",
                   test_category="simple")
  with pytest.raises(ValueError, match="unsupported java item type 'Object'"):
    bfcl.ast_check([_fn("f", {"x": {"type": "Array", "items": {"type": "Object"}}})], [{"f": {"x": "new Object[]{}"}}],
                   [{"f": {"x": [[]]}}], language="java", test_category="simple_java")
  with pytest.raises(ValueError, match="needs an items type"):
    bfcl.ast_check([_fn("f", {"x": {"type": "array"}})], [{"f": {"x": [1]}}], [{"f": {"x": [[1]]}}],
                   language="python", test_category="simple")


# ---- multi-turn ----

def _mt_oracle(lb, model_turns, truth, entry):
  r = lb.mt.multi_turn_checker(copy.deepcopy(model_turns), truth, copy.deepcopy(entry), entry["id"].rsplit("_", 1)[0],
                               f"oracle_{random.getrandbits(64)}")  # its instances live in globals, keyed by name
  return r["valid"], r.get("error_type", "") if not r["valid"] else ""


def _mt_ours(model_turns, truth, entry):
  v = bfcl_multi_turn.check(model_turns, truth, entry)
  return v.valid, v.error_type


def _wrong(call: str) -> str:
  """The call with its first literal argument changed."""
  node = ast.parse(call, mode="eval").body
  for arg in [*node.args, *(k.value for k in node.keywords)]:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, (str, int, float)) and not isinstance(arg.value, bool):
      arg.value = arg.value + ("_zz" if isinstance(arg.value, str) else 7)
      return ast.unparse(node)
  return "ls(a=True)" if not call.startswith("ls(") else "pwd()"


MT_SAMPLED = {"multi_turn_base": 8, "multi_turn_miss_func": 3, "multi_turn_miss_param": 3,
              "multi_turn_long_context": 2}


def _mt_entries():
  rng = random.Random(2)
  for category, n in MT_SAMPLED.items():
    questions, answers = bfcl.load(category)
    for q in rng.sample(questions, n):
      yield q, answers[q["id"]]["ground_truth"], rng


@pytest.mark.parametrize("entry,truth,rng", list(_mt_entries()), ids=lambda x: x["id"] if isinstance(x, dict) else "")
def test_multi_turn_matches_the_leaderboard(lb, entry, truth, rng):
  exact = [[list(calls)] if calls else [] for calls in truth]
  assert _mt_ours(exact, truth, entry) == _mt_oracle(lb, exact, truth, entry) == (True, "")
  raw = [["[" + ", ".join(calls) + "]"] if calls else [] for calls in truth]
  assert tuple(bfcl.multi_turn_check(raw, truth, entry))[:2] == (True, "")
  turn = rng.choice([t for t, calls in enumerate(truth) if calls])
  for k in range(len(truth[turn])):
    wrong = copy.deepcopy(exact)
    wrong[turn][0][k] = _wrong(wrong[turn][0][k])
    ours = _mt_ours(wrong, truth, entry)
    assert ours == _mt_oracle(lb, wrong, truth, entry), (turn, k, wrong[turn])
  empty = copy.deepcopy(exact)
  empty[turn] = []
  assert _mt_ours(empty, truth, entry) == _mt_oracle(lb, empty, truth, entry) == (
      False, "multi_turn:empty_turn_model_response")
  assert _mt_ours(exact[:-1], truth, entry) == (False, "multi_turn:force_terminated")


def test_multi_turn_every_entry_matches_the_leaderboard(lb):
  """All 800 multi-turn entries: the ground-truth trace passes, and with one call's argument changed the verdict and
  error type are the leaderboard's (mostly failures, by state or by response)."""
  rng, types_seen = random.Random(3), collections.Counter()
  for category in bfcl.MULTI_TURN_CATEGORIES:
    questions, answers = bfcl.load(category)
    for entry in questions:
      truth = answers[entry["id"]]["ground_truth"]
      exact = [[list(calls)] if calls else [] for calls in truth]
      assert _mt_ours(exact, truth, entry) == _mt_oracle(lb, exact, truth, entry) == (True, ""), entry["id"]
      turn = rng.choice([t for t, calls in enumerate(truth) if calls])
      k = rng.randrange(len(exact[turn][0]))
      exact[turn][0][k] = _wrong(exact[turn][0][k])
      ours = _mt_ours(exact, truth, entry)
      assert ours == _mt_oracle(lb, exact, truth, entry), (entry["id"], exact[turn][0][k])
      types_seen[ours[1]] += 1
  assert sum(types_seen.values()) == 800 and types_seen[""] < 0.3 * 800
  assert {"multi_turn:instance_state_mismatch", "multi_turn:execution_response_mismatch"} <= set(types_seen)


def test_execution_runs_only_api_methods():
  entry = {"id": "multi_turn_base_x", "involved_classes": ["GorillaFileSystem"], "initial_config": {
      "GorillaFileSystem": {"root": {"w": {"type": "directory", "contents": {}}}}}}
  methods = bfcl_multi_turn.public_methods(bfcl_multi_turn.api_instances(entry))
  out = bfcl_multi_turn.execute(["pwd()", "__import__('os').getcwd()", "open('/etc/passwd')", "mkdir(dir_name='d')",
                                 "cd(folder=exec(\"import sys; sys.modules['jaxlab_bfcl_probe'] = 1\"))", "ls(",
                                 "mkdir(**{'dir_name': 'e'})", "remove(x=1)"], {**methods, "remove": print})
  assert "jaxlab_bfcl_probe" not in sys.modules
  assert out[0] == json.dumps({"current_working_directory": "/w"})
  assert out[2] == "Error during execution: name 'open' is not defined"
  assert out[7] == "Error during execution: Function call remove is not allowed."
  assert all(o.startswith("Error during execution") for i, o in enumerate(out) if i not in (0, 3))
  assert json.loads(bfcl_multi_turn.execute(["ls()"], methods)[0]) == {"current_directory_content": ["d"]}


# ---- per-category scores ----

def test_score_over_a_category_matches_the_leaderboard(lb):
  questions, answers = bfcl.load("simple_javascript")
  outputs = {}
  for i, q in enumerate(questions):
    truth = _truth(answers[q["id"]]["ground_truth"])
    if i % 5 == 0:
      truth = _perturb("wrong_value", truth, q["function"], random.Random(i)) or truth
    outputs[q["id"]] = _render(q["function"], truth, "javascript")
  got = bfcl.score("simple_javascript", outputs)
  expected = [_oracle(lb, q["function"], outputs[q["id"]], answers[q["id"]]["ground_truth"], "javascript",
                      "simple_javascript") for q in questions]
  assert got["total"] == len(questions) and got["correct"] == sum(v for v, _ in expected)
  assert got["error_types"] == dict(collections.Counter(t for v, t in expected if not v))
  assert 0.7 < got["accuracy"] < 0.95


def test_score_relevance_and_missing_outputs():
  questions, _ = bfcl.load("irrelevance")
  assert bfcl.score("irrelevance", {q["id"]: "I cannot help." for q in questions})["accuracy"] == 1.0
  calls = bfcl.score("irrelevance", {q["id"]: "[f(a=1)]" for q in questions})
  assert calls["correct"] == 0 and calls["error_types"] == {"irrelevance_error:decoder_success": len(questions)}
  questions, answers = bfcl.load("multi_turn_miss_param")
  subset = questions[:5]
  outs = {q["id"]: [["[" + ", ".join(c) + "]"] if c else [] for c in answers[q["id"]]["ground_truth"]] for q in subset}
  outs[subset[0]["id"]] = [[] for _ in outs[subset[0]["id"]]]
  with pytest.raises(ValueError, match="expected an output for each of the 200"):
    bfcl.score("multi_turn_miss_param", outs)


def test_score_multi_turn_ground_truth(monkeypatch):
  questions, answers = bfcl.load("multi_turn_miss_param")
  monkeypatch.setattr(bfcl, "load", lambda category: (questions[:6], answers))
  outs = {q["id"]: [["[" + ", ".join(c) + "]"] if c else [] for c in answers[q["id"]]["ground_truth"]]
          for q in questions[:6]}
  outs[questions[0]["id"]] = [[] for _ in outs[questions[0]["id"]]]
  got = bfcl.score("multi_turn_miss_param", outs)
  assert (got["total"], got["correct"], got["failed"]) == (6, 5, [questions[0]["id"]])
  assert got["error_types"] == {"multi_turn:empty_turn_model_response": 1}


def test_missing_wheel_names_the_install(monkeypatch):
  monkeypatch.setattr(errors.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(errors.MissingDependency, match=r"needs bfcl-eval \(not installed\): pip install --no-deps "
                                                   r"bfcl-eval==2026.3.23"):
    bfcl.load("simple_python")
  with pytest.raises(ValueError, match="category must be one of"):
    bfcl.load("simple_cobol")
