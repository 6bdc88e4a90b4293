"""The mini DV-World task set: chart tasks over data that ships with installed packages (plotly's datasets,
vega_datasets, bokeh-sampledata), read at run time, each with a reference solution and broken variants.

A task is a `Spec`: a chart kind over one table, the rows kept by an equality filter, then either the raw (x, y)
points (scatter) or y aggregated per x. Its reference solution and the broken variants are plotting programs
written from the spec (pandas + matplotlib; they also write the plotted table to result.csv):
  wrong_aggregation  another aggregation (a scatter's points averaged per x)
  wrong_column       another value column, written under the asked column's name
  missing_filter     the filter left out
  wrong_chart_type   bar -> line, line -> bar, pie -> bar, scatter -> line
"""
from __future__ import annotations

import dataclasses
import os

from jaxlab import errors

BROKEN = ("wrong_aggregation", "wrong_column", "missing_filter", "wrong_chart_type")
AGGS = ("mean", "sum", "max", "min", "median")
WRONG_TYPE = {"bar": "line", "line": "bar", "pie": "bar", "scatter": "line"}

# source name -> (the no-deps wheel of jaxlab.errors.NO_DEPS, file inside its package directory)
SOURCES = {
    "tips": ("plotly", "package_data/datasets/tips.csv.gz"),
    "gapminder": ("plotly", "package_data/datasets/gapminder.csv.gz"),
    "cars": ("vega-datasets", "_data/cars.json"),
    "seattle_weather": ("vega-datasets", "_data/seattle-weather.csv"),
    "penguins": ("bokeh-sampledata", "_data/penguins.csv"),
    "autompg": ("bokeh-sampledata", "_data/auto-mpg.csv"),
}


@dataclasses.dataclass(frozen=True)
class Spec:
  """kind: bar | line | pie | scatter; y aggregated per x by `agg` (None: the raw points); rows where every
  `filter` (column, value) pair holds; title and axis labels as asked. `other_y` / `other_agg` are the wrong
  column and aggregation of the broken variants."""
  id: str
  source: str
  kind: str
  x: str
  y: str
  agg: str | None
  filter: tuple[tuple[str, object], ...]
  title: str
  xlabel: str
  ylabel: str
  other_y: str
  other_agg: str = "sum"

  def __post_init__(self):
    if self.kind not in WRONG_TYPE:
      raise ValueError(f"task {self.id}: kind must be one of {sorted(WRONG_TYPE)}, found {self.kind!r}")
    if self.agg is not None and self.agg not in AGGS or self.other_agg not in AGGS:
      raise ValueError(f"task {self.id}: aggregations must be in {AGGS}, found {self.agg!r}, {self.other_agg!r}")
    if (self.agg is None) != (self.kind == "scatter"):
      raise ValueError(f"task {self.id}: a scatter plots raw points (agg None), other kinds aggregate")
    if self.source not in SOURCES:
      raise ValueError(f"task {self.id}: source must be one of {sorted(SOURCES)}, found {self.source!r}")

  def instruction(self, columns) -> str:
    where = " and ".join(f"{c} == {v!r}" for c, v in self.filter)
    what = (f"a scatter plot of {self.y} against {self.x}" if self.agg is None else
            f"a {self.kind} chart of the {self.agg} of {self.y} per {self.x}")
    labels = (f", label the x axis {self.xlabel!r} and the y axis {self.ylabel!r}" if self.xlabel or self.ylabel
              else "")
    return (f"data.csv holds the '{self.source}' table (columns: {', '.join(columns)}). Using only the rows where "
            f"{where}, draw {what} with matplotlib{', x sorted ascending' if self.kind == 'line' else ''}. Title it "
            f"{self.title!r}{labels}, save it as result.png, and write the plotted table to result.csv with columns "
            f"{self.x}, {self.y}.")


TASKS = (
    Spec("tips_bar", "tips", "bar", "day", "tip", "mean", (("smoker", "No"),), "Mean tip by day (non-smokers)",
         "day", "mean tip", other_y="total_bill", other_agg="sum"),
    Spec("gapminder_line", "gapminder", "line", "year", "lifeExp", "mean", (("continent", "Asia"),),
         "Life expectancy in Asia", "year", "mean life expectancy", other_y="gdpPercap", other_agg="max"),
    Spec("cars_scatter", "cars", "scatter", "Horsepower", "Miles_per_Gallon", None, (("Origin", "Japan"),),
         "Japanese cars: power and economy", "horsepower", "miles per gallon", other_y="Weight_in_lbs"),
    Spec("gapminder_pie", "gapminder", "pie", "continent", "pop", "sum", (("year", 2007),),
         "World population by continent, 2007", "", "", other_y="gdpPercap", other_agg="mean"),
    Spec("penguins_bar", "penguins", "bar", "species", "body_mass_g", "mean", (("sex", "FEMALE"),),
         "Body mass of female penguins", "species", "mean body mass (g)", other_y="flipper_length_mm",
         other_agg="max"),
    Spec("autompg_line", "autompg", "line", "yr", "mpg", "median", (("cyl", 4),), "Four-cylinder fuel economy",
         "model year", "median mpg", other_y="hp", other_agg="mean"),
    Spec("tips_pie", "tips", "pie", "day", "total_bill", "sum", (("time", "Dinner"),), "Dinner takings by day",
         "", "", other_y="tip", other_agg="mean"),
    Spec("penguins_scatter", "penguins", "scatter", "bill_length_mm", "bill_depth_mm", None,
         (("species", "Gentoo"),), "Gentoo bills", "bill length (mm)", "bill depth (mm)",
         other_y="flipper_length_mm"),
    Spec("weather_bar", "seattle_weather", "bar", "weather", "wind", "max", (("precipitation", 0.0),),
         "Strongest wind on dry days", "weather", "max wind", other_y="temp_max", other_agg="mean"),
    Spec("tips_line", "tips", "line", "size", "tip", "median", (("sex", "Female"),), "Tip by party size",
         "party size", "median tip", other_y="total_bill", other_agg="mean"),
)
BY_ID = {t.id: t for t in TASKS}


def source_path(source: str) -> str:
  """The installed file of a source, found without importing its package; a one-line error naming the install
  (jaxlab.errors.MissingDependency when the wheel is not installed)."""
  pkg, rel = SOURCES[source]
  path = os.path.join(errors.package_dir(pkg, f"dvworld data {source!r}"), rel)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"dvworld data {source!r}: expected {rel} of the installed package {pkg!r}, found "
                            f"nothing; reinstall it: {errors.install_command(pkg)} --force-reinstall")
  return path


def load_frame(source: str):
  """The source table as a pandas DataFrame."""
  import pandas as pd
  path = source_path(source)
  return pd.read_json(path) if path.endswith(".json") else pd.read_csv(path)


def data_csv(source: str, cache_dir: str) -> str:
  """The source table written once as `{cache_dir}/{source}.csv` (what the programs read as data.csv)."""
  os.makedirs(cache_dir, exist_ok=True)
  out = os.path.join(cache_dir, f"{source}.csv")
  if not os.path.exists(out):
    load_frame(source).to_csv(out + ".tmp", index=False)
    os.replace(out + ".tmp", out)
  return out


def variant(spec: Spec, kind: str | None) -> dict:
  """What the program of `kind` (None: the reference) computes and draws: y column read, aggregation, filter,
  chart kind."""
  v = {"read": spec.y, "agg": spec.agg, "filter": spec.filter, "kind": spec.kind}
  if kind == "wrong_aggregation":
    v["agg"] = spec.other_agg if spec.agg is not None else "mean"
  elif kind == "wrong_column":
    v["read"] = spec.other_y
  elif kind == "missing_filter":
    v["filter"] = ()
  elif kind == "wrong_chart_type":
    v["kind"] = WRONG_TYPE[spec.kind]
  elif kind is not None:
    raise ValueError(f"broken kind must be one of {BROKEN} (or None for the reference), found {kind!r}")
  return v


def table_code(spec: Spec, v: dict) -> str:
  """pandas lines that leave the plotted table in `t` (columns x, y) from data.csv."""
  lines = ["df = pd.read_csv('data.csv')"]
  for c, val in v["filter"]:
    lines.append(f"df = df[df[{c!r}] == {val!r}]")
  if v["agg"] is None:
    lines.append(f"t = df[[{spec.x!r}, {v['read']!r}]].dropna()")
  else:
    lines.append(f"t = df.groupby({spec.x!r})[{v['read']!r}].{v['agg']}().reset_index()")
  lines.append(f"t.columns = [{spec.x!r}, {spec.y!r}]")
  if v["kind"] == "line":
    lines.append(f"t = t.sort_values({spec.x!r})")
  return "\n".join(lines)


def draw_code(spec: Spec, kind: str) -> str:
  x, y = f"t[{spec.x!r}]", f"t[{spec.y!r}]"
  return {"bar": f"ax.bar({x}.astype(str), {y})", "line": f"ax.plot({x}, {y})",
          "scatter": f"ax.scatter({x}, {y})", "pie": f"ax.pie({y}, labels={x}.astype(str))"}[kind]


def program(spec: Spec, kind: str | None = None) -> str:
  """The reference solution (kind None) or the broken variant `kind`, as a Python program."""
  v = variant(spec, kind)
  return "\n".join([
      "import matplotlib.pyplot as plt", "import pandas as pd", table_code(spec, v), "fig, ax = plt.subplots()",
      draw_code(spec, v["kind"]), f"ax.set_title({spec.title!r})", f"ax.set_xlabel({spec.xlabel!r})",
      f"ax.set_ylabel({spec.ylabel!r})", "t.to_csv('result.csv', index=False)", "fig.savefig('result.png')", ""])


def select(ids) -> tuple[Spec, ...]:
  """Tasks by id, in the given order (all of them for None)."""
  if ids is None:
    return TASKS
  unknown = [i for i in ids if i not in BY_ID]
  if unknown:
    raise ValueError(f"unknown dvworld task ids {unknown}; known: {sorted(BY_ID)}")
  return tuple(BY_ID[i] for i in ids)
