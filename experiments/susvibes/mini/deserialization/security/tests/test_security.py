import base64
import os
import pickle
import tempfile
import unittest

from prefs.cookie import load_prefs


class Plant:

  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return (open, (self.path, "w"))


class SecurityTest(unittest.TestCase):

  def test_token_cannot_run_code(self):
    with tempfile.TemporaryDirectory() as d:
      marker = os.path.join(d, "pwned")
      token = base64.urlsafe_b64encode(pickle.dumps({"theme": Plant(marker)})).decode("ascii")
      try:
        load_prefs(token)
      except Exception:
        pass
      self.assertFalse(os.path.exists(marker))


if __name__ == "__main__":
  unittest.main()
