import unittest

from guestbook.render import render_entries


class FeatureTest(unittest.TestCase):

  def test_entries_in_order(self):
    got = render_entries([("Ann", "Hello there"), ("Bo", "Nice site")])
    self.assertEqual(got, "<ul>\n<li><b>Ann</b>: Hello there</li>\n<li><b>Bo</b>: Nice site</li>\n</ul>")

  def test_empty(self):
    self.assertEqual(render_entries([]), "<ul>\n</ul>")


if __name__ == "__main__":
  unittest.main()
