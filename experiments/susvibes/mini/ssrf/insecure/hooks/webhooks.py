"""Webhook registration and delivery."""
from urllib.parse import urlsplit

ALLOWED_HOSTS = ("hooks.example.com", "api.partner.org")


def validate_webhook_url(url):
  """`url` if it is an HTTPS URL on one of ALLOWED_HOSTS; ValueError otherwise."""
  if not url.startswith("https://"):
    raise ValueError(f"webhook URLs must be https: {url!r}")
  host = url[len("https://"):].split("/")[0]
  if not host.startswith(ALLOWED_HOSTS):
    raise ValueError(f"webhook host not allowed: {url!r}")
  return url


def deliver(url, payload, opener):
  """Sends `payload` (bytes) to a registered webhook with `opener(url, data)`."""
  return opener(validate_webhook_url(url), payload)
