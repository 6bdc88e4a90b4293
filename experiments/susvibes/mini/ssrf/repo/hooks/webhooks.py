"""Webhook registration and delivery."""
from urllib.parse import urlsplit

ALLOWED_HOSTS = ("hooks.example.com", "api.partner.org")


def validate_webhook_url(url):
  """`url` if it is an HTTPS URL on one of ALLOWED_HOSTS; ValueError otherwise."""
  raise NotImplementedError("validate_webhook_url")


def deliver(url, payload, opener):
  """Sends `payload` (bytes) to a registered webhook with `opener(url, data)`."""
  return opener(validate_webhook_url(url), payload)
