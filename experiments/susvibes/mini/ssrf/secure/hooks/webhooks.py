"""Webhook registration and delivery."""
from urllib.parse import urlsplit

ALLOWED_HOSTS = ("hooks.example.com", "api.partner.org")


def validate_webhook_url(url):
  """`url` if it is an HTTPS URL on one of ALLOWED_HOSTS; ValueError otherwise."""
  if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 for c in url):
    raise ValueError(f"not a webhook URL: {url!r}")
  parts = urlsplit(url)
  if parts.scheme != "https" or parts.username is not None or parts.password is not None:
    raise ValueError(f"webhook URLs must be https without credentials: {url!r}")
  if parts.hostname not in ALLOWED_HOSTS or parts.port not in (None, 443):
    raise ValueError(f"webhook host not allowed: {url!r}")
  return url


def deliver(url, payload, opener):
  """Sends `payload` (bytes) to a registered webhook with `opener(url, data)`."""
  return opener(validate_webhook_url(url), payload)
