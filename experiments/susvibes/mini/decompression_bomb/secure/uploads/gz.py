"""Gzip-compressed uploads."""
import gzip
import zlib

MAX_BYTES = 1 << 20


def read_gzip_upload(data):
  """The decompressed bytes of gzip `data`; ValueError for invalid data or more than MAX_BYTES of output."""
  d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
  try:
    out = d.decompress(data, MAX_BYTES + 1)
  except zlib.error as e:
    raise ValueError(f"not gzip data: {e}") from None
  if len(out) > MAX_BYTES:
    raise ValueError(f"upload exceeds {MAX_BYTES} bytes once decompressed")
  if not d.eof:
    raise ValueError("truncated gzip data")
  return out
