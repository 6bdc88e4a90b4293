import hashlib
import unittest

from users.passwords import check_password, hash_password


class SecurityTest(unittest.TestCase):

  def test_salted(self):
    a, b = hash_password("hunter2"), hash_password("hunter2")
    self.assertNotEqual(a, b, "equal passwords must not give equal stored values")
    self.assertTrue(check_password("hunter2", a) and check_password("hunter2", b))

  def test_not_a_plain_digest(self):
    stored = hash_password("hunter2")
    for name in ("md5", "sha1", "sha256", "sha512"):
      self.assertNotIn(hashlib.new(name, b"hunter2").hexdigest(), stored, name)


if __name__ == "__main__":
  unittest.main()
