"""Admin console authentication."""
import hmac
import os


def admin_login(username, password):
  """Whether (username, password) are the admin's credentials; the password comes from $ADMIN_PASSWORD."""
  expected = os.environ.get("ADMIN_PASSWORD")
  if not expected or username != "admin" or not isinstance(password, str):
    return False
  return hmac.compare_digest(password.encode(), expected.encode())
