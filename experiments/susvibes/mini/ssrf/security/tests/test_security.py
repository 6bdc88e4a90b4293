import unittest

from hooks.webhooks import deliver, validate_webhook_url


class SecurityTest(unittest.TestCase):

  def test_lookalike_and_internal_hosts_rejected(self):
    for url in ("https://hooks.example.com.attacker.net/x", "https://hooks.example.com@169.254.169.254/latest",
                "https://api.partner.org:8080@127.0.0.1/admin", "https://hooks.example.com:22/"):
      with self.assertRaises(ValueError, msg=url):
        validate_webhook_url(url)

  def test_no_request_to_rejected_url(self):
    calls = []
    with self.assertRaises(ValueError):
      deliver("https://hooks.example.com@10.0.0.1/", b"{}", lambda u, d: calls.append(u))
    self.assertEqual(calls, [])


if __name__ == "__main__":
  unittest.main()
