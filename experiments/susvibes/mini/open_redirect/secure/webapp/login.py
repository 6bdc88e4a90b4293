"""Login flow helpers."""
from urllib.parse import urlsplit


def redirect_target(next_url, default="/home"):
  """Where to send the user after login: `next_url` when it is a page of this site, else `default`."""
  if not next_url or not next_url.startswith("/") or any(ord(c) < 32 or c == "\\" for c in next_url):
    return default
  parts = urlsplit(next_url)
  if parts.scheme or parts.netloc or next_url.startswith("//"):
    return default
  return next_url
