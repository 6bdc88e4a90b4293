"""BFCL function-calling checker (Berkeley Function Calling Leaderboard v4, experiments/bfcl_audio/README.md).

`ast_check` gives the leaderboard's AST verdict and error type for one model output; `relevance_check` the
(ir)relevance verdict (irrelevance passes when no call decodes); `multi_turn_check` runs both call traces on the
`bfcl-eval` wheel's API classes (`bfcl_multi_turn`); `score` reads the wheel's question / possible-answer files of
one category and reports accuracy and error-type counts.

Rules (mode="leaderboard", the wheel's checker on every input): the expected function name must be a key of the
call (with `underscore_to_dot`, dots in the expected name become underscores); required parameters present; every
given parameter in the schema and in the possible answer; Python: int accepted for float, tuples compared as lists,
one level of item types checked in arrays; Java / JavaScript: values are source-literal strings, converted by the
type's literal rules (`123L` long, `1.5f` float, `123n` Bigint, `new int[]{...}`, `new ArrayList<>(Arrays.asList(
...))`, `new HashMap<>() {{ put(...); }}`, `[...]`, `{k: v}`) and, when a literal does not parse, kept as a string;
a value whose type differs from the schema's but matches the possible answer's is a variable (compared plainly);
strings, and strings in lists and dicts, are normalised (spaces and , . / - _ * ^ removed, lowercased, ' -> ");
a parameter may be omitted only when "" is among its possible values. "parallel" categories match calls to
expected calls in any order, "multiple" checks the first call against the first expected one.

Decoding follows the leaderboard's prompt decoder (keyword arguments only; a bare name becomes its string, a call
without keywords its source text) except that, where the leaderboard `eval`s a binary expression, only numeric
arithmetic on literals is computed here and anything else fails to decode.

mode="strict" fixes three leaderboard bugs, each a deliberate divergence:
  1. parallel matching: the leaderboard assigns each expected call greedily to the first unused call that matches
     it, so it can fail outputs that have a valid assignment; strict finds a maximum bipartite matching.
  2. dict values: the leaderboard compares dict (and list-of-dict) values by equality only, so True matches 1 and
     1.0 matches True; strict also requires the value's type to be the possible value's (int accepted for float).
  3. Java String[] / char[] literals: the leaderboard keeps the quotes of `new String[]{"a", "b"}`'s elements, so
     they never match; strict strips them as its ArrayList rule does.
"""
from __future__ import annotations

import ast
import collections
import json
import os
import re
from typing import Any, Mapping, Sequence

from experiments.bfcl_audio import bfcl_multi_turn
from experiments.bfcl_audio.bfcl_multi_turn import OK, Verdict, require_bfcl_eval

LANGUAGES = ("python", "java", "javascript")
MODES = ("leaderboard", "strict")
AST_CATEGORIES = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
                  "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
PYTHON_TYPES = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list,
                "dict": dict, "any": str}
JAVA_TYPES = {"byte": int, "short": int, "integer": int, "float": float, "double": float, "long": int, "boolean": bool,
              "char": str, "Array": list, "ArrayList": list, "Set": set, "HashMap": dict, "Hashtable": dict,
              "Queue": list, "Stack": list, "String": str, "any": str}
JS_TYPES = {"String": str, "integer": int, "float": float, "Bigint": int, "Boolean": bool, "dict": dict, "array": list,
            "any": str}
_COLLECTIONS = ("Array", "ArrayList", "array")
_NORMALISE = re.compile(r"[ ,./\-_*^]")


class DecodeError(ValueError):
  """A model output that is not a call list."""


def _fail(error_type: str, message: str) -> Verdict:
  return Verdict(False, error_type, (message,))


def language_of(category: str) -> str:
  return "javascript" if "javascript" in category else "java" if "java" in category else "python"


# ---- decoding ----

def _resolve(node: ast.AST):
  """A decoded argument value, by the leaderboard's rules (positional arguments are dropped by the caller)."""
  if isinstance(node, ast.Constant):
    return "..." if node.value is Ellipsis else node.value
  if isinstance(node, ast.UnaryOp):  # the leaderboard negates any unary operand (+x included)
    try:
      return -node.operand.value
    except (AttributeError, TypeError):
      raise DecodeError(f"unsupported unary operand in {ast.unparse(node)!r}") from None
  if isinstance(node, ast.List):
    return [_resolve(v) for v in node.elts]
  if isinstance(node, ast.Tuple):
    return tuple(_resolve(v) for v in node.elts)
  if isinstance(node, ast.Dict):
    if any(k is None for k in node.keys):
      raise DecodeError(f"unsupported dict unpacking {ast.unparse(node)!r}")
    return {_resolve(k): _resolve(v) for k, v in zip(node.keys, node.values)}
  if isinstance(node, ast.BinOp):
    return _arithmetic(node)
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Call):
    return _resolve_call(node) if node.keywords else ast.unparse(node)
  if isinstance(node, ast.Subscript):
    return f"{ast.unparse(node.value)}[{ast.unparse(node.slice)}]"
  raise DecodeError(f"unsupported AST type {type(node).__name__} in {ast.unparse(node)!r}")


_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}


def _arithmetic(node: ast.AST):
  """Numeric arithmetic on literals (the leaderboard evaluates any binary expression; only this is safe)."""
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    return node.value
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    return -_arithmetic(node.operand)
  if isinstance(node, ast.BinOp):
    a, b = _arithmetic(node.left), _arithmetic(node.right)
    try:
      if type(node.op) in _OPS:
        return _OPS[type(node.op)](a, b)
      if isinstance(node.op, ast.Pow) and abs(b) <= 64:
        return a ** b
    except (ArithmeticError, ValueError) as e:
      raise DecodeError(f"{ast.unparse(node)!r}: {e}") from None
  raise DecodeError(f"only numeric arithmetic on literals is evaluated; found {ast.unparse(node)!r}")


def _resolve_call(node: ast.Call) -> dict:
  parts, f = [], node.func
  while isinstance(f, ast.Attribute):
    parts.append(f.attr)
    f = f.value
  if isinstance(f, ast.Name):
    parts.append(f.id)
  return {".".join(reversed(parts)): {k.arg: _resolve(k.value) for k in node.keywords}}


def decode_prompt(text: str) -> list[dict]:
  """Python call syntax ("[f(a=1), g(b='x')]", brackets optional) -> [{"f": {"a": 1}}, {"g": {"b": "x"}}]."""
  if not isinstance(text, str):
    raise DecodeError(f"expected the model's text, found {type(text).__name__}")
  text = text.strip("`\n ")
  text = ("" if text.startswith("[") else "[") + text + ("" if text.endswith("]") else "]")
  try:
    body = ast.parse(text.strip().strip("'"), mode="eval").body
  except SyntaxError as e:
    raise DecodeError(f"not Python call syntax: {e}") from None
  if isinstance(body, ast.Call):
    return [_resolve_call(body)]
  if not isinstance(body, (ast.List, ast.Tuple, ast.Set)):
    raise DecodeError(f"expected a list of calls, found {type(body).__name__}")
  if not all(isinstance(e, ast.Call) for e in body.elts):
    raise DecodeError("expected a list of calls, found a non-call element")
  return [_resolve_call(e) for e in body.elts]


def decode_fc(calls) -> list[dict]:
  """FC-style tool calls (a JSON string or list of {"name": n, "arguments": args} or {n: args}, args a dict or its
  JSON) -> [{n: args}]."""
  try:
    if isinstance(calls, str):
      calls = json.loads(calls)
    if isinstance(calls, dict):
      calls = [calls]
    out = []
    for c in calls:
      name, args = (c["name"], c["arguments"]) if set(c) == {"name", "arguments"} else next(iter(c.items()))
      out.append({name: json.loads(args) if isinstance(args, str) else args})
    return out
  except (TypeError, ValueError, KeyError, StopIteration, AttributeError) as e:
    raise DecodeError(f"not FC-style tool calls: {e!r}") from None


def decode(output) -> list[dict]:
  """A prompt-style string (Python call syntax) or FC-style calls -> [{name: {param: value}}]."""
  return decode_prompt(output) if isinstance(output, str) else decode_fc(output)


def is_call_list(decoded) -> bool:
  """[{name: {param: value}}, ...] (the empty list included)."""
  return isinstance(decoded, list) and all(
      type(c) is dict and len(c) == 1 and type(next(iter(c.values()))) is dict for c in decoded)


def _is_empty(decoded) -> bool:
  return not is_call_list(decoded) or len(decoded) == 0 or (len(decoded) == 1 and len(decoded[0]) == 0)


def _repr_nested(value) -> str:
  if isinstance(value, dict):
    if all(isinstance(v, dict) for v in value.values()):
      name, args = next(iter(value.items()))
      return f"{name}({', '.join(f'{k}={_repr_nested(v)}' for k, v in args.items())})"
    return "{" + ", ".join(f"'{k}': {_repr_nested(v)}" for k, v in value.items()) + "}"
  return repr(value)


def decode_execute(output) -> list[str]:
  """One model step -> executable call strings ("cd(folder='x')"), prompt-style or FC-style."""
  if isinstance(output, str):
    return [f"{n}({', '.join(f'{k}={_repr_nested(v)}' for k, v in a.items())})"
            for c in decode_prompt(output) for n, a in c.items()]
  return [f"{n}({','.join(f'{k}={v!r}' for k, v in a.items())})" for c in decode_fc(output) for n, a in c.items()]


# ---- Java / JavaScript literals ----

def _java_value(text: str):
  """A Java literal of unknown type."""
  if text in ("true", "false"):
    return text == "true"
  if text.startswith('"') and text.endswith('"'):
    return text[1:-1]
  if re.match(r"^-?\d+[lL]$", text):
    return int(text[:-1])
  if re.match(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]$", text):
    return float(text[:-1])
  for parse in (int, float):
    try:
      return parse(text)
    except ValueError:
      pass
  return text


def _java(text: str, kind: str, item: str | None = None, strict: bool = False):
  """A Java literal of schema type `kind` (items of type `item`); a literal that does not parse stays a string."""
  if kind not in JAVA_TYPES:
    raise ValueError(f"unsupported Java type {kind!r}; expected one of {sorted(JAVA_TYPES)}")
  if kind in ("byte", "short", "integer"):
    return int(text) if re.match(r"^-?\d+$", text) else text
  if kind == "float":
    return float(text[:-1]) if re.match(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]$", text) else text
  if kind == "double":
    return float(text) if re.match(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?$", text) else text
  if kind == "long":
    return int(text[:-1]) if re.match(r"^-?\d+[lL]$", text) else text
  if kind == "boolean":
    return text == "true" if text in ("true", "false") else text
  if kind == "ArrayList":
    return _java_arraylist(text, item)
  if kind == "Array":
    m = re.search(r"new\s+\w+\[\]\s*\{(.*?)\}", text)
    if not m:
      return text
    parts = [x.strip() for x in m.group(1).split(",") if x.strip()]
    if strict and item in ("String", "char"):
      return [x[1:-1] for x in parts]
    return [_java(x, item) if item else _java_value(x) for x in parts]
  if kind == "HashMap":
    m = re.search(r"new\s+HashMap<.*?>\s*\(\)\s*\{\s*\{?\s*(.*?)\s*\}?\s*\}", text, re.DOTALL)
    if m:
      return {k: _java_value(v.strip()) for k, v in re.findall(r"put\(\"(.*?)\",\s*(.*?)\)", m.group(1))}
    return {} if re.search(r"new\s+HashMap<.*?>\s*\(\)", text) else text
  if kind in ("Set", "Hashtable", "Queue", "Stack"):
    raise NotImplementedError(f"Java {kind} literals are not converted (nor by the leaderboard)")
  return text  # String, char, any


def _java_arraylist(text: str, item: str | None):
  def element(x):
    x = x.strip()
    if item in ("char", "String"):
      return x[1:-1]
    return _java(x, item) if item else _java_value(x)
  if m := re.search(r"new\s+ArrayList<\w*>\(Arrays\.asList\((.+?)\)\)", text):
    return [element(x) for x in m.group(1).split(",")]
  if m := re.search(r"new\s+ArrayList<\w*>\(\)\s*\{\{\s*(.+?)\s*\}\}", text, re.DOTALL):
    return [element(x) for x in re.findall(r"add\((.+?)\)", m.group(1))]
  return [] if re.search(r"new\s+ArrayList<\w*>\(\)", text) else text


def _js_value(text: str):
  text = text.strip()
  if text in ("true", "false"):
    return text == "true"
  if len(text) >= 1 and text[0] == text[-1] and text[0] in "'\"":
    return text[1:-1]
  for parse in (int, float):
    try:
      return parse(text)
    except ValueError:
      pass
  return text


def _js(text: str, kind: str, item: str | None = None):
  """A JavaScript literal of schema type `kind`; a literal that does not parse stays a string."""
  if kind not in JS_TYPES:
    raise ValueError(f"unsupported JavaScript type {kind!r}; expected one of {sorted(JS_TYPES)}")
  if kind == "String":
    quoted = len(text) >= 1 and text[0] == text[-1] and text[0] in "'\""
    return text[1:-1] if quoted else text
  if kind == "integer":
    return int(text) if re.match(r"^-?\d+$", text) else text
  if kind == "float":
    return float(text) if re.match(r"^-?\d+(\.\d+)?$", text) else text
  if kind == "Bigint":
    return int(text[:-1]) if re.match(r"^-?\d+n$", text) else text
  if kind == "Boolean":
    return text == "true" if text in ("true", "false") else text
  if kind == "array":
    return _js_array(text.strip(), item)
  if kind == "dict":
    return _js_dict(text.strip())
  return text  # any


def _js_array(code: str, item: str | None):
  grid = re.match(r"\[\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\]|\bnew\s+Array\(\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\)", code)
  try:
    if grid:
      rows = []
      for i, row in enumerate(re.findall(r"\[(.*?)\]", grid.group(0))):
        row = row.strip()
        row = row[1:] if i == 0 and row.startswith("[") else row
        rows.append([_js_value(e.strip()) for e in row.split(",")])
      return rows
    m = re.match(r"\[(.*?)\]|\bnew\s+Array\((.*?)\)", code)
    if not m:
      return code
    inner = (m.group(1) if m.group(1) is not None else m.group(2) or "").strip()
    parts = inner.split(",") if inner else []
    return [_js(e.strip(), item) if item else _js_value(e.strip()) for e in parts]
  except (ValueError, IndexError):
    return code


def _js_dict(code: str):
  if code == "{}":
    return {}
  m = re.match(r"\{(.*?)\}", code)
  if not m:
    return code
  out = {}
  for key, value in re.findall(r"([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)", m.group(1)):
    key, value = key.strip().strip("'\""), value.strip()
    if value.startswith("[") and value.endswith("]"):
      out[key] = _js_array(value, None)
    elif value.startswith("{") and value.endswith("}"):
      out[key] = _js_dict(value)
    else:
      out[key] = _js_value(value.strip("'\""))
  return out


# ---- the AST checker ----

def normalise(text: str) -> str:
  """The leaderboard's string normalisation: spaces and , . / - _ * ^ removed, lowercased, ' -> "."""
  return _NORMALISE.sub("", text).lower().replace("'", '"')


def _norm(value):
  return normalise(value) if type(value) is str else value


def _kind_ok(value, expected) -> bool:
  return type(value) is type(expected) or (type(value) is int and type(expected) is float)


def _answer_type(possible: Sequence):
  return next((type(a) for a in possible if a != ""), None)


def _type_check(param, value, possible, described, expected, item) -> tuple[Verdict, bool]:
  """(verdict, is_variable): the leaderboard's one-level type check; a value of the possible answer's type when it
  is not the schema's is a variable."""
  answer_type = _answer_type(possible)
  is_variable = answer_type is not None and answer_type != expected
  if type(value) == expected:
    if item is None:
      return OK, is_variable
    for option in possible:
      if type(option) != list or all(_type_check(param, v, option, str(item), item, None)[0].valid for v in value):
        return OK, is_variable
    if type(value) == answer_type:
      return _fail("type_error:nested", f"Nested type checking failed for parameter {param!r}: expected {described} "
                   f"of {item.__name__}, got {value!r}."), True
  elif answer_type is not None and type(value) == answer_type:
    return OK, True
  return _fail("type_error:simple", f"Incorrect type for parameter {param!r}: expected {described}, got "
               f"{type(value).__name__} ({value!r})."), False


def _dict_check(param, value: dict, possible: Sequence, strict: bool) -> Verdict:
  verdict = Verdict(False, "dict_checker:unclear")
  for option in possible:
    if option == "":
      continue
    verdict = OK
    for key, v in value.items():
      if key not in option:
        verdict = _fail("value_error:dict_key", f"Unexpected dict key {key!r} in parameter {param!r}.")
        break
      if not any(_norm(v) == _norm(o) and (not strict or _kind_ok(v, o)) for o in option[key]):
        verdict = _fail("value_error:dict_value", f"Invalid value for {param!r}[{key!r}]: {v!r}; expected one of "
                        f"{list(option[key])}.")
        break
    for key, options in option.items():
      if key not in value and "" not in options:
        verdict = _fail("value_error:dict_key", f"Missing dict key {key!r} in parameter {param!r}.")
        break
    if verdict.valid:
      return OK
  return verdict


def _list_dict_check(param, value: list, possible: Sequence, strict: bool) -> Verdict:
  verdict = Verdict(False, "list_dict_checker:unclear")
  for option in possible:
    if len(value) != len(option):
      verdict = _fail("value_error:list_dict_count", f"Wrong number of dictionaries in parameter {param!r}.")
      continue
    for v, o in zip(value, option):
      if not (verdict := _dict_check(param, v, [o], strict)).valid:
        break
    else:
      return OK
  return verdict


def _call_check(function: Mapping, call: Mapping, expected: Mapping, language: str, underscore_to_dot: bool,
                strict: bool) -> Verdict:
  """One call {name: params} against one expected call {name: {param: possible values}}."""
  possible = next(iter(expected.values()))
  name = function["name"]
  if underscore_to_dot and "." in name:
    name = name.replace(".", "_")
  if name not in call:
    return _fail("simple_function_checker:wrong_func_name", f"Function name {name!r} not found in model output.")
  params, schema = call[name], function["parameters"]["properties"]
  for p in function["parameters"]["required"]:
    if p not in params:
      return _fail("simple_function_checker:missing_required", f"Missing required parameter: {p!r}.")
  for p, value in params.items():
    if p not in schema or p not in possible:
      return _fail("simple_function_checker:unexpected_param", f"Unexpected parameter: {p!r}.")
    described, item = schema[p]["type"], None
    if language == "python":
      if described not in PYTHON_TYPES:
        raise ValueError(f"unsupported Python type {described!r} for {p!r}; expected one of {sorted(PYTHON_TYPES)}")
      expected_type = PYTHON_TYPES[described]
      if described in ("array", "tuple"):
        if (item_name := _items_type(schema, p)) not in PYTHON_TYPES:
          raise ValueError(f"unsupported Python item type {item_name!r} for {p!r}; expected one of "
                           f"{sorted(PYTHON_TYPES)}")
        item = PYTHON_TYPES[item_name]
      if described == "tuple" and type(value) == tuple:
        value = list(value)
      if described == "float" and type(value) == int:
        value = float(value)
    else:
      table, convert = (JAVA_TYPES, _java) if language == "java" else (JS_TYPES, _js)
      if described not in table:
        raise ValueError(f"unsupported {language} type {described!r} for {p!r}; expected one of {sorted(table)}")
      expected_type = table[described]
      if type(value) != str:
        return _fail("type_error:java" if language == "java" else "type_error:js", f"Incorrect type for parameter "
                     f"{p!r}: expected a {language} literal string, got {type(value).__name__} ({value!r}).")
      if described in _COLLECTIONS:
        item_name = _items_type(schema, p)
        if item_name not in table:
          raise ValueError(f"unsupported {language} item type {item_name!r} for {p!r}; expected one of {sorted(table)}")
        item = table[item_name]
        value = _java(value, described, item_name, strict) if language == "java" else _js(value, described, item_name)
      else:
        value = convert(value, described)
    verdict, is_variable = _type_check(p, value, possible[p], described, expected_type, item)
    if not verdict.valid:
      return verdict
    if not is_variable:
      if expected_type == dict:
        check = _dict_check(p, value, possible[p], strict)
      elif expected_type == list and item == dict:
        check = _list_dict_check(p, value, possible[p], strict)
      elif expected_type == str:
        ok = normalise(value) in [normalise(o) for o in possible[p] if type(o) == str]
        check = OK if ok else _fail("value_error:string", f"Invalid value for parameter {p!r}: {value!r}; expected "
                                    f"one of {list(possible[p])} (normalised).")
      elif expected_type == list:
        ok = [_norm(v) for v in value] in [[_norm(o) for o in option] for option in possible[p]]
        check = OK if ok else _fail("value_error:list/tuple", f"Invalid value for parameter {p!r}: {value!r}; "
                                    f"expected one of {list(possible[p])}.")
      else:
        check = None
      if check is not None:
        if not check.valid:
          return check
        continue
    if value not in possible[p]:
      return _fail("value_error:others", f"Invalid value for parameter {p!r}: {value!r}; expected one of "
                   f"{list(possible[p])}.")
  for p, options in possible.items():
    if p not in params and "" not in options:
      return _fail("simple_function_checker:missing_optional", f"Optional parameter {p!r} not provided and not "
                   "marked as optional.")
  return OK


def _items_type(schema: Mapping, p: str) -> str:
  if "items" not in schema[p] or "type" not in schema[p]["items"]:
    raise ValueError(f"parameter {p!r} of type {schema[p]['type']!r} needs an items type; found {schema[p]!r}")
  return schema[p]["items"]["type"]


def _describe(functions: Sequence[Mapping], name: str):
  found = next((f for f in functions if f["name"] == name), None)
  if found is None:
    raise ValueError(f"expected function {name!r} in the function list; found {[f['name'] for f in functions]}")
  return found


def _parallel_check(functions, calls, expected, language, underscore_to_dot, strict) -> Verdict:
  if len(calls) != len(expected):
    return _fail("parallel_function_checker_no_order:wrong_count", "Wrong number of functions.")
  fits = [[_call_check(_describe(functions, next(iter(e))), c, e, language, underscore_to_dot, strict).valid
           for c in calls] for e in expected]
  if strict:
    unmatched = _unmatched(fits)
  else:
    used, unmatched = set(), None
    for i, row in enumerate(fits):
      j = next((j for j, ok in enumerate(row) if ok and j not in used), None)
      if j is None:
        unmatched = i
        break
      used.add(j)
  if unmatched is None:
    return OK
  return _fail("parallel_function_checker_no_order:cannot_find_match",
               f"Could not find a matching function among the model output for index {unmatched} of possible answers.")


def _unmatched(fits: Sequence[Sequence[bool]]) -> int | None:
  """The first expected call left unmatched by a maximum bipartite matching (augmenting paths), else None."""
  owner: dict[int, int] = {}

  def augment(i, seen):
    for j, ok in enumerate(fits[i]):
      if ok and j not in seen:
        seen.add(j)
        if j not in owner or augment(owner[j], seen):
          owner[j] = i
          return True
    return False

  return next((i for i in range(len(fits)) if not augment(i, set())), None)


def ast_check(functions: Sequence[Mapping], model_output, possible_answer: Sequence[Mapping], *, language: str,
              test_category: str, underscore_to_dot: bool = False, mode: str = "leaderboard") -> Verdict:
  """The AST verdict on one model output.

  Args:
    functions: the entry's function schemas (the question file's "function").
    model_output: decoded calls [{name: {param: value}}], FC-style calls, or prompt-style text (Python only).
    possible_answer: the possible-answer file's "ground_truth", [{name: {param: [possible values]}}].
    language: "python", "java" or "javascript" (Java / JavaScript values are literal strings).
    test_category: "parallel" in it: order-free matching; else "multiple": the first call; else one call.
    underscore_to_dot: the model names functions with "_" for "." (expected names are renamed to match).
    mode: "leaderboard" (the wheel's verdict, bugs included) or "strict" (the fixes in the module docstring).
  """
  if language not in LANGUAGES:
    raise ValueError(f"language must be one of {LANGUAGES}; found {language!r}")
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}; found {mode!r}")
  if isinstance(model_output, str) and language != "python":
    raise ValueError(f"prompt-style text is decoded for Python only; pass {language} calls decoded, found text")
  if not is_call_list(model_output):
    try:
      model_output = decode(model_output)
    except DecodeError as e:
      return _fail("ast_decoder:decoder_failed", f"Invalid syntax. Failed to decode AST. {e}")
    if not is_call_list(model_output):
      return _fail("ast_decoder:decoder_wrong_output_format", "Did not output in the specified format.")
  strict = mode == "strict"
  if "parallel" in test_category:
    return _parallel_check(functions, model_output, possible_answer, language, underscore_to_dot, strict)
  if "multiple" in test_category:
    if len(model_output) != len(possible_answer):
      return _fail("multiple_function_checker:wrong_count", "Wrong number of functions.")
    function = _describe(functions, next(iter(possible_answer[0])))
    return _call_check(function, model_output[0], possible_answer[0], language, underscore_to_dot, strict)
  if len(model_output) != 1:
    return _fail("simple_function_checker:wrong_count", "Wrong number of functions.")
  return _call_check(functions[0], model_output[0], possible_answer[0], language, underscore_to_dot, strict)


def relevance_check(model_output, *, test_category: str) -> Verdict:
  """Irrelevance ("irrelevance" in the category): valid when no call decodes; relevance: valid when one does."""
  try:
    decoded = model_output if is_call_list(model_output) else decode(model_output)
    has_call, reason = not _is_empty(decoded), ""
  except DecodeError as e:
    has_call, reason = False, str(e)
  if "irrelevance" in test_category:
    return OK if not has_call else _fail("irrelevance_error:decoder_success", "Decoded a call when none was due.")
  return OK if has_call else _fail("relevance_error:decoder_failed", f"Failed to decode a call. {reason}")


def decode_turns(turns) -> list[list[list[str]]]:
  """A multi-turn model result (per turn, per step, raw output) -> per turn, the steps' call strings; steps that do
  not decode or decode to nothing are left out, as on the leaderboard."""
  out = []
  for steps in turns:
    decoded = []
    for step in steps:
      try:
        calls = decode_execute(step)
      except DecodeError:
        continue
      if calls:
        decoded.append(calls)
    out.append(decoded)
  return out


def multi_turn_check(model_turns, ground_truth: Sequence[Sequence[str]], entry: Mapping[str, Any]) -> Verdict:
  """The multi-turn verdict on raw model turns (per turn, per step, prompt- or FC-style output)."""
  if not isinstance(model_turns, list):
    return _fail("multi_turn:inference_error", f"expected a list of turns, found {type(model_turns).__name__}")
  return bfcl_multi_turn.check(decode_turns(model_turns), ground_truth, entry)


# ---- the wheel's data ----

def _read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def system_prompt(functions) -> str:
  """BFCL's default prompt-style system prompt over `functions` (JSON docs), from the installed wheel."""
  require_bfcl_eval()
  from bfcl_eval.constants.default_prompts import DEFAULT_SYSTEM_PROMPT_FORMAT
  from bfcl_eval.model_handler.utils import formulate_system_prompt
  return formulate_system_prompt(DEFAULT_SYSTEM_PROMPT_FORMAT, functions)


def load(category: str) -> tuple[list[dict], dict[str, dict]]:
  """The wheel's question entries of `category` and its possible answers by id (empty for (ir)relevance)."""
  known = AST_CATEGORIES + RELEVANCE_CATEGORIES + MULTI_TURN_CATEGORIES
  if category not in known:
    raise ValueError(f"category must be one of {known}; found {category!r}")
  data = os.path.join(require_bfcl_eval(), "data")
  questions = _read_jsonl(os.path.join(data, f"BFCL_v4_{category}.json"))
  answer_path = os.path.join(data, "possible_answer", f"BFCL_v4_{category}.json")
  answers = {a["id"]: a for a in _read_jsonl(answer_path)} if os.path.exists(answer_path) else {}
  return questions, answers


def score(category: str, model_outputs: Mapping[str, Any], *, mode: str = "leaderboard",
          underscore_to_dot: bool = False) -> dict:
  """Accuracy over one category of the wheel's data.

  Args:
    category: e.g. "simple_python", "parallel_multiple", "irrelevance", "multi_turn_base" (see `load`).
    model_outputs: entry id -> the model's output (as `ast_check`, `relevance_check` or `multi_turn_check` take
      it); every entry of the category must have one.
    mode, underscore_to_dot: as in `ast_check`.

  Returns:
    {"category", "total", "correct", "accuracy", "error_types": {error type: count}, "failed": [ids]}.
  """
  questions, answers = load(category)
  missing = [q["id"] for q in questions if q["id"] not in model_outputs]
  if missing:
    raise ValueError(f"expected an output for each of the {len(questions)} {category} entries; missing {missing[:5]}")
  errors, failed = collections.Counter(), []
  for q in questions:
    out = model_outputs[q["id"]]
    if category in RELEVANCE_CATEGORIES:
      verdict = relevance_check(out, test_category=category)
    elif category in MULTI_TURN_CATEGORIES:
      verdict = multi_turn_check(out, answers[q["id"]]["ground_truth"], q)
    else:
      verdict = ast_check(q["function"], out, answers[q["id"]]["ground_truth"], language=language_of(category),
                          test_category=category, underscore_to_dot=underscore_to_dot, mode=mode)
    if not verdict.valid:
      errors[verdict.error_type] += 1
      failed.append(q["id"])
  total = len(questions)
  return {"category": category, "total": total, "correct": total - len(failed),
          "accuracy": (total - len(failed)) / total if total else 0.0, "error_types": dict(errors), "failed": failed}
