"""`experiments.registry`: the runner's registry (experiments/runner/registry.py) under the name experiments use.

Importing this module gives that module object itself, so `registry.register(...)`, `registry.plot_curves(...)`
and a test's `monkeypatch.setattr(registry, ...)` all act on the one registry.
"""
import sys

from experiments.runner import registry as _registry

sys.modules[__name__] = _registry
