import gzip
import unittest

from uploads.gz import MAX_BYTES, read_gzip_upload


class FeatureTest(unittest.TestCase):

  def test_round_trip(self):
    data = b"hello world\n" * 1000
    self.assertEqual(read_gzip_upload(gzip.compress(data)), data)

  def test_size_limit(self):
    self.assertEqual(len(read_gzip_upload(gzip.compress(bytes(MAX_BYTES)))), MAX_BYTES)
    with self.assertRaises(ValueError):
      read_gzip_upload(gzip.compress(bytes(MAX_BYTES + 1)))

  def test_invalid(self):
    with self.assertRaises(ValueError):
      read_gzip_upload(b"plain text")


if __name__ == "__main__":
  unittest.main()
