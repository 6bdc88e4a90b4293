"""A document store: each document is a file under the store's root directory."""
import os


class DocumentStore:

  def __init__(self, root):
    self.root = os.path.realpath(root)

  def save(self, name, text):
    path = self.resolve(name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)

  def read(self, name):
    with open(self.resolve(name)) as f:
      return f.read()

  def resolve(self, name):
    """The absolute path of document `name` (a relative path such as "notes/today.txt") under the root."""
    if not name:
      raise ValueError("empty document name")
    return os.path.join(self.root, *name.split("/"))
