"""Login flow helpers."""
from urllib.parse import urlsplit


def redirect_target(next_url, default="/home"):
  """Where to send the user after login: `next_url` when it is a page of this site, else `default`."""
  raise NotImplementedError("redirect_target")
