"""Unpacking of uploaded plugin bundles (zip archives)."""
import os
import zipfile


def extract_bundle(zip_path, dest):
  """Extracts the files of zip archive `zip_path` into `dest`; returns their archive names, sorted."""
  root = os.path.realpath(dest)
  with zipfile.ZipFile(zip_path) as zf:
    members = [m for m in zf.infolist() if not m.is_dir()]
    targets = []
    for m in members:
      target = os.path.realpath(os.path.join(root, m.filename))
      if os.path.isabs(m.filename) or os.path.commonpath([root, target]) != root or target == root:
        raise ValueError(f"bundle member {m.filename!r} leaves the destination")
      targets.append(target)
    for m, target in zip(members, targets):
      os.makedirs(os.path.dirname(target), exist_ok=True)
      with open(target, "wb") as f:
        f.write(zf.read(m))
  return sorted(m.filename for m in members)
