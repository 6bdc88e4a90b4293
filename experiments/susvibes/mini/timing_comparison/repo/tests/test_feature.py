import unittest

from hooks.signing import sign, verify_signature


class FeatureTest(unittest.TestCase):

  def test_valid_and_invalid(self):
    sig = sign(b"key", b"payload")
    self.assertTrue(verify_signature(b"key", b"payload", sig))
    self.assertFalse(verify_signature(b"key", b"payload2", sig))
    self.assertFalse(verify_signature(b"other", b"payload", sig))
    self.assertFalse(verify_signature(b"key", b"payload", "00" * 32))


if __name__ == "__main__":
  unittest.main()
