"""Test set-up: 8 virtual CPU devices so sharding is real, fp32 matmuls for parity with PyTorch, one persistent
compilation cache per test run; `sandbox` tests only where the sandbox can run."""
import functools
import gc
import os
import shutil
import subprocess
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The run's compilation cache, made by the first process that loads this file (pytest's controller), inherited by
# the xdist workers and the CLI subprocesses the tests start: a program one of them compiled is loaded by the others.
# The size cap turns on jax's file lock, so no process reads an entry another is still writing.
_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxlab-tests-jit-")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(16 << 30))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@functools.lru_cache(maxsize=None)
def sandbox_unavailable() -> str | None:
  """Why jaxlab.evals.sandbox cannot run here, or None: it needs bwrap and, called by a user other than root, a
  user namespace of its own (probed once, with the flags of the sandbox's unprivileged mode)."""
  if shutil.which("bwrap") is None:
    return "bubblewrap is not installed (apt-get install -y bubblewrap)"
  if os.geteuid() == 0:
    return None
  probe = ["bwrap", "--unshare-user", "--disable-userns", "--ro-bind", "/", "/", "true"]
  p = subprocess.run(probe, capture_output=True, text=True)
  if p.returncode:
    return (f"uid {os.geteuid()} cannot create a user namespace ({' '.join(probe)}: {p.stderr.strip()}); "
            "unprivileged user namespaces are off here (sysctl user.max_user_namespaces, "
            "kernel.unprivileged_userns_clone, or AppArmor's kernel.apparmor_restrict_unprivileged_userns)")
  return None


def pytest_runtest_setup(item):
  """`@pytest.mark.sandbox` tests run code in bubblewrap (as root, or as another user in a user namespace); they
  skip, saying what is missing, where it cannot run."""
  if item.get_closest_marker("sandbox") and (why := sandbox_unavailable()):
    pytest.skip(f"sandbox unavailable: {why}")


@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_programs():
  """Frees each test file's compiled programs when the file is done. XLA:CPU maps every loaded executable's code
  and data into the process, and a worker that keeps all of a suite's programs nears the kernel's limit on
  mappings (vm.max_map_count, 65530), where an allocation inside the next XLA compile fails and the worker dies
  of a segfault. Programs a later file needs again come back from the compilation cache."""
  yield
  jax.clear_caches()
  gc.collect()


def pytest_unconfigure(config):
  if _CACHE is not None and not hasattr(config, "workerinput"):  # the controller made it; the workers are done
    shutil.rmtree(_CACHE, ignore_errors=True)
