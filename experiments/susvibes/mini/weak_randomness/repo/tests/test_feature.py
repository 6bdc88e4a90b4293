import re
import unittest

from accounts.reset import PENDING, new_reset_token, start_reset


class FeatureTest(unittest.TestCase):

  def test_format(self):
    self.assertRegex(new_reset_token(), r"^[0-9a-f]{32}$")

  def test_fresh(self):
    self.assertEqual(len({new_reset_token() for _ in range(50)}), 50)

  def test_start_reset(self):
    token = start_reset("ann")
    self.assertEqual(PENDING[token], "ann")


if __name__ == "__main__":
  unittest.main()
