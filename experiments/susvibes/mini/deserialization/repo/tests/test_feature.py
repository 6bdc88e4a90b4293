import re
import unittest

from prefs.cookie import dump_prefs, load_prefs


class FeatureTest(unittest.TestCase):

  def test_round_trip(self):
    prefs = {"theme": "dark", "size": 12, "beta": True, "tags": ["a", "b"]}
    token = dump_prefs(prefs)
    self.assertIsInstance(token, str)
    self.assertRegex(token, r"^[A-Za-z0-9_=-]+$")
    self.assertEqual(load_prefs(token), prefs)

  def test_garbage(self):
    with self.assertRaises(ValueError):
      load_prefs("not a token!")


if __name__ == "__main__":
  unittest.main()
