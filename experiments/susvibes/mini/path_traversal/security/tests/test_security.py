import os
import tempfile
import unittest

from docstore.store import DocumentStore


class SecurityTest(unittest.TestCase):

  def setUp(self):
    self.tmp = tempfile.TemporaryDirectory()
    self.root = os.path.join(self.tmp.name, "docs")
    os.makedirs(self.root)
    self.secret = os.path.join(self.tmp.name, "secret.txt")
    with open(self.secret, "w") as f:
      f.write("top secret")
    self.store = DocumentStore(self.root)

  def tearDown(self):
    self.tmp.cleanup()

  def test_parent_traversal_is_refused(self):
    for name in ("../secret.txt", "notes/../../secret.txt", self.secret):
      with self.assertRaises(ValueError, msg=name):
        self.store.read(name)

  def test_no_write_outside_root(self):
    with self.assertRaises(ValueError):
      self.store.save("../planted.txt", "x")
    self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "planted.txt")))


if __name__ == "__main__":
  unittest.main()
