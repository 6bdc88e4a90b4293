"""Reading and writing safetensors files (single or sharded with an index) as NumPy, without torch.

bfloat16 tensors come back as `ml_dtypes.bfloat16` arrays; files are memory-mapped.
"""
from __future__ import annotations

import json
import mmap
import os
import struct

import ml_dtypes
import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
           "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def read_file(path: str) -> dict[str, np.ndarray]:
  with open(path, "rb") as f:
    size = os.fstat(f.fileno()).st_size
    if size < 8:
      raise ValueError(f"{path}: not a safetensors file (only {size} bytes): truncated?")
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
  (n,) = struct.unpack("<Q", buf[:8])
  if 8 + n > len(buf):
    raise ValueError(f"{path}: header of {n} bytes runs past the end of the file ({len(buf)} bytes): truncated?")
  header = json.loads(buf[8:8 + n])
  header.pop("__metadata__", None)
  out = {}
  for name, info in header.items():
    if info["dtype"] not in _DTYPES:
      raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
    start, end = info["data_offsets"]
    if 8 + n + end > len(buf):
      raise ValueError(f"{path}: tensor {name!r} runs past the end of the file: truncated?")
    arr = np.frombuffer(buf, dtype=_DTYPES[info["dtype"]], count=int(np.prod(info["shape"], dtype=np.int64)),
                        offset=8 + n + start)
    out[name] = arr.reshape(info["shape"])
  return out


def write_file(path: str, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
  header, offset, blobs = {}, 0, []
  for name in sorted(tensors):
    a = np.ascontiguousarray(tensors[name])
    if a.dtype not in _NAMES:
      raise ValueError(f"tensor {name!r}: dtype {a.dtype} cannot be written to safetensors")
    b = a.tobytes()
    header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
    offset += len(b)
    blobs.append(b)
  header["__metadata__"] = {"format": "pt", **(metadata or {})}
  h = json.dumps(header, separators=(",", ":")).encode()
  h += b" " * (-len(h) % 8)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for b in blobs:
      f.write(b)
  os.replace(tmp, path)


def read_dir(path: str) -> dict[str, np.ndarray]:
  """All tensors of a checkpoint directory: `model.safetensors`, or the shards its index names."""
  index = os.path.join(path, INDEX)
  if os.path.exists(index):
    with open(index) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
  elif os.path.exists(os.path.join(path, SINGLE)):
    files = [SINGLE]
  else:
    found = sorted(os.listdir(path)) if os.path.isdir(path) else "no such directory"
    raise FileNotFoundError(f"{path}: expected {SINGLE} or {INDEX}, found {found}")
  out = {}
  for name in files:
    out.update(read_file(os.path.join(path, name)))
  return out


def write_dir(path: str, tensors: dict[str, np.ndarray], max_shard_bytes: int = 5 * 2**30) -> None:
  """Writes one file, or shards plus an index when the total exceeds `max_shard_bytes`."""
  os.makedirs(path, exist_ok=True)
  shards, cur, size = [], {}, 0
  for name in sorted(tensors):
    nbytes = tensors[name].nbytes
    if cur and size + nbytes > max_shard_bytes:
      shards.append(cur)
      cur, size = {}, 0
    cur[name] = tensors[name]
    size += nbytes
  shards.append(cur)
  if len(shards) == 1:
    write_file(os.path.join(path, SINGLE), shards[0])
    return
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    write_file(os.path.join(path, fname), shard)
    weight_map.update({k: fname for k in shard})
  total = sum(t.nbytes for t in tensors.values())
  with open(os.path.join(path, INDEX), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def check_writable(path: str, overwrite: bool) -> None:
  if os.path.exists(os.path.join(path, "config.json")) and not overwrite:
    raise FileExistsError(f"{path} already holds a checkpoint; pass overwrite=True to replace it")


def write_checkpoint(path: str, config: dict, tensors: dict[str, np.ndarray], max_shard_bytes: int = 5 * 2**30):
  """config.json (with the stored dtype) and the tensors; old weight files in `path` are removed first, and
  config.json is written last, so an interrupted save never leaves a config over the wrong weights."""
  config = dict(config)
  config["torch_dtype"] = config["dtype"] = dtype_name(next(iter(tensors.values())).dtype)
  if os.path.isdir(path):  # weights being replaced, or debris of a save interrupted before config.json
    for name in os.listdir(path):
      if name.endswith(".safetensors") or name == INDEX:
        os.remove(os.path.join(path, name))
  write_dir(path, tensors, max_shard_bytes)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f, indent=2)


def dtype_name(dtype) -> str:
  return {np.dtype(np.float32): "float32", np.dtype(ml_dtypes.bfloat16): "bfloat16",
          np.dtype(np.float16): "float16"}.get(np.dtype(dtype), str(np.dtype(dtype)))


def read_config(path: str) -> dict:
  f = os.path.join(path, "config.json")
  if not os.path.exists(f):
    raise FileNotFoundError(f"{path}: expected a transformers-format directory with config.json")
  with open(f) as fh:
    return json.load(fh)
