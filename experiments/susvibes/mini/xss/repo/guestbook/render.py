"""HTML rendering of the guestbook page."""
import html


def render_entries(entries):
  """The HTML list of guestbook entries [(author, message), ...]."""
  raise NotImplementedError("render_entries")
