import os
import tempfile
import unittest

from keystore.save import save_private_key

PEM = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n"


class FeatureTest(unittest.TestCase):

  def test_writes_and_replaces(self):
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, "id.pem")
      self.assertEqual(save_private_key(path, "old"), path)
      save_private_key(path, PEM)
      with open(path) as f:
        self.assertEqual(f.read(), PEM)


if __name__ == "__main__":
  unittest.main()
