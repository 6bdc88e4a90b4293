import os
import tempfile
import unittest
import zipfile

from bundles.unpack import extract_bundle


class SecurityTest(unittest.TestCase):

  def test_members_cannot_leave_dest(self):
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, "b.zip")
      with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("ok.txt", "fine")
        zf.writestr("../evil.txt", "planted")
        zf.writestr("a/../../../evil2.txt", "planted")
      dest = os.path.join(d, "out")
      os.makedirs(dest)
      with self.assertRaises(ValueError):
        extract_bundle(path, dest)
      self.assertFalse(os.path.exists(os.path.join(d, "evil.txt")))
      self.assertFalse(os.path.exists(os.path.join(os.path.dirname(d), "evil2.txt")))


if __name__ == "__main__":
  unittest.main()
