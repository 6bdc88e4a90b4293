"""Admin console authentication."""
import hmac
import os


def admin_login(username, password):
  """Whether (username, password) are the admin's credentials; the password comes from $ADMIN_PASSWORD."""
  expected = os.environ.get("ADMIN_PASSWORD", "changeme")
  return username == "admin" and password == expected
