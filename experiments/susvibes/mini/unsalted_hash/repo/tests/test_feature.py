import unittest

from users.passwords import check_password, hash_password


class FeatureTest(unittest.TestCase):

  def test_check(self):
    stored = hash_password("correct horse")
    self.assertNotIn("correct horse", stored)
    self.assertTrue(check_password("correct horse", stored))
    self.assertFalse(check_password("wrong horse", stored))


if __name__ == "__main__":
  unittest.main()
