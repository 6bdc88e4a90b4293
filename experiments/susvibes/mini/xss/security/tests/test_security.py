import unittest
from html.parser import HTMLParser

from guestbook.render import render_entries


class Tags(HTMLParser):

  def __init__(self):
    super().__init__()
    self.tags, self.attrs, self.text = [], [], []

  def handle_starttag(self, tag, attrs):
    self.tags.append(tag)
    self.attrs += [k for k, _ in attrs]

  def handle_data(self, data):
    self.text.append(data)


class SecurityTest(unittest.TestCase):

  def test_markup_in_entries_is_text(self):
    author, message = "<script>alert(1)</script>", '<img src=x onerror="alert(2)"> & more'
    parser = Tags()
    parser.feed(render_entries([(author, message)]))
    self.assertEqual(parser.tags, ["ul", "li", "b"])
    self.assertEqual(parser.attrs, [])
    self.assertIn(author, "".join(parser.text))
    self.assertIn(message, "".join(parser.text))


if __name__ == "__main__":
  unittest.main()
