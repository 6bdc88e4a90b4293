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
    if not name or os.path.isabs(name) or "\x00" in name:
      raise ValueError(f"not a document name: {name!r}")
    path = os.path.realpath(os.path.join(self.root, *name.split("/")))
    if os.path.commonpath([self.root, path]) != self.root or path == self.root:
      raise ValueError(f"document name {name!r} leaves the store")
    return path
