import os
import unittest
from unittest import mock

from admin.auth import admin_login


class FeatureTest(unittest.TestCase):

  def test_login(self):
    with mock.patch.dict(os.environ, {"ADMIN_PASSWORD": "s3cret!pass"}):
      self.assertTrue(admin_login("admin", "s3cret!pass"))
      self.assertFalse(admin_login("admin", "wrong"))
      self.assertFalse(admin_login("root", "s3cret!pass"))


if __name__ == "__main__":
  unittest.main()
