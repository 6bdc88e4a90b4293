import unittest

from forms.validate import is_valid_username


class FeatureTest(unittest.TestCase):

  def test_valid(self):
    for name in ("ann", "j.doe", "team-7_x", "A1"):
      self.assertTrue(is_valid_username(name), name)

  def test_invalid(self):
    for name in ("", ".ann", "ann.", "a..b", "a b", "ann!", "j_-doe"):
      self.assertFalse(is_valid_username(name), name)


if __name__ == "__main__":
  unittest.main()
