"""The product catalog, stored in SQLite."""
import sqlite3


def create_schema(conn):
  conn.execute("CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL NOT NULL)")
  conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, password TEXT NOT NULL)")


def add_product(conn, name, price):
  conn.execute("INSERT INTO products (name, price) VALUES (?, ?)", (name, price))


def search_products(conn: sqlite3.Connection, term: str):
  """(name, price) of every product whose name contains `term`, ignoring case, ordered by name."""
  rows = conn.execute(f"SELECT name, price FROM products WHERE name LIKE '%{term}%' ORDER BY name")
  return [tuple(r) for r in rows]
