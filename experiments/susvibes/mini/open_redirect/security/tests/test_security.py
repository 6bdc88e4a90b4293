import unittest

from webapp.login import redirect_target


class SecurityTest(unittest.TestCase):

  def test_protocol_relative_and_lookalike_urls_give_default(self):
    for url in ("//evil.example/", "/\\evil.example", "/\t/evil.example", "///evil.example"):
      self.assertEqual(redirect_target(url), "/home", repr(url))


if __name__ == "__main__":
  unittest.main()
