"""Admin console authentication."""
import hmac
import os


def admin_login(username, password):
  """Whether (username, password) are the admin's credentials; the password comes from $ADMIN_PASSWORD."""
  raise NotImplementedError("admin_login")
