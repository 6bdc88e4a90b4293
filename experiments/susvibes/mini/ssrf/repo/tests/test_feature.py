import unittest

from hooks.webhooks import deliver, validate_webhook_url


class FeatureTest(unittest.TestCase):

  def test_allowed(self):
    for url in ("https://hooks.example.com/t/123", "https://api.partner.org/events?x=1"):
      self.assertEqual(validate_webhook_url(url), url)

  def test_rejected(self):
    for url in ("http://hooks.example.com/t", "https://other.net/t", "ftp://api.partner.org/x", "hooks.example.com"):
      with self.assertRaises(ValueError, msg=url):
        validate_webhook_url(url)

  def test_deliver_uses_opener(self):
    calls = []
    deliver("https://hooks.example.com/t", b"{}", lambda u, d: calls.append((u, d)))
    self.assertEqual(calls, [("https://hooks.example.com/t", b"{}")])


if __name__ == "__main__":
  unittest.main()
