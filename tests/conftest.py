"""Test set-up: 8 virtual CPU devices so sharding is real, fp32 matmuls for parity with PyTorch."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_runtest_setup(item):
  """`@pytest.mark.sandbox` tests run code in bubblewrap as root (uid nobody inside); elsewhere they skip."""
  if item.get_closest_marker("sandbox") and not (os.path.exists("/usr/bin/bwrap") and os.geteuid() == 0):
    pytest.skip("needs root and bubblewrap (apt-get install -y bubblewrap)")
