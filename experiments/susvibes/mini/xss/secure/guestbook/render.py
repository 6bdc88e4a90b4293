"""HTML rendering of the guestbook page."""
import html


def render_entries(entries):
  """The HTML list of guestbook entries [(author, message), ...]."""
  items = "".join(f"<li><b>{html.escape(a)}</b>: {html.escape(m)}</li>\n" for a, m in entries)
  return f"<ul>\n{items}</ul>"
