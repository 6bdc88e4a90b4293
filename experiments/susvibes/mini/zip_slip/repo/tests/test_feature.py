import os
import tempfile
import unittest
import zipfile

from bundles.unpack import extract_bundle


class FeatureTest(unittest.TestCase):

  def test_extracts_files(self):
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, "b.zip")
      with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("plugin.py", "x = 1\n")
        zf.writestr("data/", "")
        zf.writestr("data/config.json", "{}")
      dest = os.path.join(d, "out")
      os.makedirs(dest)
      self.assertEqual(extract_bundle(path, dest), ["data/config.json", "plugin.py"])
      with open(os.path.join(dest, "data", "config.json")) as f:
        self.assertEqual(f.read(), "{}")


if __name__ == "__main__":
  unittest.main()
