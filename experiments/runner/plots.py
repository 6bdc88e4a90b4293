"""PNG plots for run directories (matplotlib, Agg backend)."""
from __future__ import annotations


def plot_curves(path: str, series: dict[str, tuple[list, list]], xlabel: str = "step", ylabel: str = "loss",
                title: str = "", logy: bool = False) -> str:
  """A PNG line plot of {label: (xs, ys)} (matplotlib Agg)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
  for label, (xs, ys) in series.items():
    if len(xs):
      ax.plot(xs, ys, label=label, marker="o" if len(xs) < 20 else None, markersize=3)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if logy:
    ax.set_yscale("log")
  if title:
    ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path
