import sqlite3
import unittest

from shop import catalog


class FeatureTest(unittest.TestCase):

  def setUp(self):
    self.conn = sqlite3.connect(":memory:")
    catalog.create_schema(self.conn)
    for name, price in (("banana", 1.5), ("apple", 2.0), ("cherry pie", 7.25), ("green apple", 2.5)):
      catalog.add_product(self.conn, name, price)

  def test_substring_match_ordered(self):
    self.assertEqual(catalog.search_products(self.conn, "apple"), [("apple", 2.0), ("green apple", 2.5)])

  def test_case_insensitive(self):
    self.assertEqual(catalog.search_products(self.conn, "PIE"), [("cherry pie", 7.25)])

  def test_no_match(self):
    self.assertEqual(catalog.search_products(self.conn, "kiwi"), [])


if __name__ == "__main__":
  unittest.main()
