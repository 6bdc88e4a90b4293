"""Gzip-compressed uploads."""
import gzip
import zlib

MAX_BYTES = 1 << 20


def read_gzip_upload(data):
  """The decompressed bytes of gzip `data`; ValueError for invalid data or more than MAX_BYTES of output."""
  raise NotImplementedError("read_gzip_upload")
