import os
import tempfile
import unittest

from docstore.store import DocumentStore


class FeatureTest(unittest.TestCase):

  def setUp(self):
    self.tmp = tempfile.TemporaryDirectory()
    self.root = os.path.join(self.tmp.name, "docs")
    os.makedirs(self.root)
    self.store = DocumentStore(self.root)

  def tearDown(self):
    self.tmp.cleanup()

  def test_save_and_read_nested(self):
    self.store.save("notes/today.txt", "hello")
    self.assertEqual(self.store.read("notes/today.txt"), "hello")
    self.assertTrue(os.path.isfile(os.path.join(self.root, "notes", "today.txt")))

  def test_resolve_is_under_root(self):
    self.assertEqual(self.store.resolve("a.txt"), os.path.join(os.path.realpath(self.root), "a.txt"))

  def test_empty_name(self):
    with self.assertRaises(ValueError):
      self.store.resolve("")


if __name__ == "__main__":
  unittest.main()
