"""Storage of generated private keys."""
import os


def save_private_key(path, pem):
  """Writes private key text `pem` to `path` (replacing an existing file); returns `path`."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  try:
    os.fchmod(fd, 0o600)
    os.write(fd, pem.encode())
  finally:
    os.close(fd)
  return path
