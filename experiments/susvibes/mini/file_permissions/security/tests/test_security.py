import os
import stat
import tempfile
import unittest

from keystore.save import save_private_key


class SecurityTest(unittest.TestCase):

  def test_only_the_owner_can_read(self):
    old = os.umask(0o022)
    try:
      with tempfile.TemporaryDirectory() as d:
        fresh = os.path.join(d, "new.pem")
        save_private_key(fresh, "key")
        existing = os.path.join(d, "old.pem")
        with open(existing, "w") as f:
          f.write("public")
        os.chmod(existing, 0o644)
        save_private_key(existing, "key")
        for path in (fresh, existing):
          self.assertEqual(stat.S_IMODE(os.stat(path).st_mode) & 0o077, 0, path)
    finally:
      os.umask(old)


if __name__ == "__main__":
  unittest.main()
