"""Gzip-compressed uploads."""
import gzip
import zlib

MAX_BYTES = 1 << 20


def read_gzip_upload(data):
  """The decompressed bytes of gzip `data`; ValueError for invalid data or more than MAX_BYTES of output."""
  try:
    out = gzip.decompress(data)
  except (OSError, EOFError, zlib.error) as e:
    raise ValueError(f"not gzip data: {e}") from None
  if len(out) > MAX_BYTES:
    raise ValueError(f"upload exceeds {MAX_BYTES} bytes once decompressed")
  return out
