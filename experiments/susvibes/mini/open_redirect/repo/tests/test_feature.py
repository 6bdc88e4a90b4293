import unittest

from webapp.login import redirect_target


class FeatureTest(unittest.TestCase):

  def test_local_paths_kept(self):
    for url in ("/account?tab=2", "/", "/a/b#c"):
      self.assertEqual(redirect_target(url), url)

  def test_other_values_give_default(self):
    for url in ("https://example.net/", "", None, "javascript:alert(1)"):
      self.assertEqual(redirect_target(url), "/home", url)
    self.assertEqual(redirect_target("http://x.org", default="/"), "/")


if __name__ == "__main__":
  unittest.main()
