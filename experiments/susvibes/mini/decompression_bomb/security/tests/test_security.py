import tracemalloc
import unittest
import zlib

from uploads.gz import read_gzip_upload


def bomb(megabytes):
  c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
  chunk = bytes(1 << 20)
  return b"".join([c.compress(chunk) for _ in range(megabytes)] + [c.flush()])


class SecurityTest(unittest.TestCase):

  def test_bomb_is_refused_without_inflating_it(self):
    data = bomb(64)
    tracemalloc.start()
    try:
      with self.assertRaises(ValueError):
        read_gzip_upload(data)
      peak = tracemalloc.get_traced_memory()[1]
    finally:
      tracemalloc.stop()
    self.assertLess(peak, 16 << 20)


if __name__ == "__main__":
  unittest.main()
