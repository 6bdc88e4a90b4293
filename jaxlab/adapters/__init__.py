"""Parameter-efficient adapters over plain param trees, without touching model code.

lora (LoRA / rsLoRA, merge/unmerge, frozen base via optax masking, PEFT export/import), kron (CDKA Kronecker
adapters, reshape application, parameter-budget helper, nearest-Kronecker analysis), fslora (federated sketching
LoRA simulation with FedLoRA and HetLoRA baselines).
"""
from jaxlab.adapters import fslora, kron, lora

__all__ = ["fslora", "kron", "lora"]
