"""Storage of generated private keys."""
import os


def save_private_key(path, pem):
  """Writes private key text `pem` to `path` (replacing an existing file); returns `path`."""
  raise NotImplementedError("save_private_key")
