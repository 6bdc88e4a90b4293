"""jaxlab: a JAX research stack for transformers, diffusion LMs, VLMs, optimizers, adapters and kernels."""
__version__ = "0.1.0"
