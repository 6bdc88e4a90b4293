import sqlite3
import unittest

from shop import catalog


class SecurityTest(unittest.TestCase):

  def setUp(self):
    self.conn = sqlite3.connect(":memory:")
    catalog.create_schema(self.conn)
    catalog.add_product(self.conn, "banana", 1.5)
    catalog.add_product(self.conn, "O'Brien's jam", 4.0)
    self.conn.execute("INSERT INTO users (name, password) VALUES ('admin', 'hunter2')")

  def test_quotes_are_data(self):
    self.assertEqual(catalog.search_products(self.conn, "O'Brien"), [("O'Brien's jam", 4.0)])

  def test_injection_returns_nothing(self):
    for term in ("' OR 1=1 --", "x' UNION SELECT name, password FROM users --"):
      try:
        rows = catalog.search_products(self.conn, term)
      except sqlite3.Error:
        self.fail(f"the query broke on {term!r}")
      self.assertEqual(rows, [], term)


if __name__ == "__main__":
  unittest.main()
