import os
import tempfile
import unittest

from textstats.lines import count_lines


class FeatureTest(unittest.TestCase):

  def test_counts_lines(self):
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, "a.txt")
      with open(path, "w") as f:
        f.write("one\ntwo\nthree\n")
      self.assertEqual(count_lines(path), 3)

  def test_missing_file(self):
    with self.assertRaises(FileNotFoundError):
      count_lines("/nonexistent/file.txt")


if __name__ == "__main__":
  unittest.main()
