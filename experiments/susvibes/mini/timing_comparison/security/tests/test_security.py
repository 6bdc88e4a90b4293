import hmac
import importlib
import secrets
import sys
import unittest
from unittest import mock


class SecurityTest(unittest.TestCase):

  def test_constant_time_comparison(self):
    real, calls = hmac.compare_digest, []

    def spy(a, b):
      calls.append((a, b))
      return real(a, b)

    with mock.patch.object(hmac, "compare_digest", spy), mock.patch.object(secrets, "compare_digest", spy):
      sys.modules.pop("hooks.signing", None)
      signing = importlib.import_module("hooks.signing")
      sig = signing.sign(b"key", b"payload")
      self.assertTrue(signing.verify_signature(b"key", b"payload", sig))
      self.assertFalse(signing.verify_signature(b"key", b"payload", "0" + sig[1:] if sig[0] != "0" else "1" + sig[1:]))
    sys.modules.pop("hooks.signing", None)
    self.assertGreaterEqual(len(calls), 2, "the signature must be compared with hmac.compare_digest")


if __name__ == "__main__":
  unittest.main()
