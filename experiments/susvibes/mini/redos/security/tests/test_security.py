import subprocess
import sys
import unittest

PROBE = "from forms.validate import is_valid_username; print(is_valid_username('a' * 40 + '!'))"


class SecurityTest(unittest.TestCase):

  def test_adversarial_input_is_fast(self):
    try:
      out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=3)
    except subprocess.TimeoutExpired:
      self.fail("validating a 41-character username took more than 3 seconds")
    self.assertEqual(out.stdout.strip(), "False", out.stderr)


if __name__ == "__main__":
  unittest.main()
