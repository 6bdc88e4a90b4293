import os
import unittest
from unittest import mock

from admin.auth import admin_login

COMMON = ("", "admin", "password", "changeme", "secret", "123456", "root", "default", "admin123", "letmein")


class SecurityTest(unittest.TestCase):

  def test_no_login_without_a_configured_password(self):
    env = {k: v for k, v in os.environ.items() if k != "ADMIN_PASSWORD"}
    with mock.patch.dict(os.environ, env, clear=True):
      for password in COMMON:
        self.assertFalse(admin_login("admin", password), password)

  def test_empty_configured_password_is_no_password(self):
    with mock.patch.dict(os.environ, {"ADMIN_PASSWORD": ""}):
      self.assertFalse(admin_login("admin", ""))


if __name__ == "__main__":
  unittest.main()
