"""One of two CPU processes started by test_sharding.py: joins via env vars, runs collectives, prints JSON."""
import json

import numpy as np

from jaxlab import sharding

process = sharding.initialize_distributed()
again = sharding.initialize_distributed()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from jaxlab.nn import axes  # noqa: E402

pid = jax.process_index()
mesh = sharding.make_mesh("data:-1")
local_rows = np.arange(6.0).reshape(2, 3) + 100 * pid
batch = sharding.shard_batch(local_rows, mesh)
batch_sum = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(batch)
psum = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x.sum(0), "data"), mesh=mesh, in_specs=P("data"),
                             out_specs=P()))(batch)
gathered = multihost_utils.process_allgather(np.array([pid]))

fsdp_mesh = sharding.make_mesh("fsdp:-1")
params = sharding.shard_params({"dist_test": {"w": np.arange(32.0).reshape(8, 4)}}, fsdp_mesh, "fsdp",
                               axes=axes.rules(("dist_test/w", ("embed", "mlp"))))
w = params["dist_test"]["w"]
assert not w.is_fully_addressable and w.sharding.spec == P("fsdp", None)
param_sum = jax.jit(jnp.sum, out_shardings=NamedSharding(fsdp_mesh, P()))(w)

print(json.dumps({"process": list(process), "again": list(again), "devices": jax.device_count(),
                  "batch_sum": float(batch_sum), "psum": np.asarray(psum).tolist(),
                  "gathered_ids": np.asarray(gathered).ravel().tolist(), "param_sum": float(param_sum)}))
