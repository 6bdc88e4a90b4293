"""Generated rooms as coloured point clouds, and egocentric clips rendered from them by a point rasterizer.

For spatio-temporal questions in the manner of REA (STLLM, arXiv 2507.05258). A room is a square floor with
furniture standing in slots along its walls and small objects lying on the furniture. Each piece is a real mesh
shipped with `pybullet_data`, scaled to the piece's box, with surface points sampled by `trimesh` (once per mesh
and process) and coloured by the piece's type. The agent's clip: it walks from the room's centre to the
furniture holding an object, takes it, and then carries it to another piece and puts it down ("move"), keeps it
in hand and turns back toward the room's centre ("pick"), or uses it and puts it back ("use"). Each frame is
rendered from the agent's camera by `rasterize`: pinhole projection of the room's points (OpenCV camera: x
right, y down, z forward; pixel (u, v) covers [u, u+1) x [v, v+1)), a square splat per point shrinking with
depth, nearest point wins; pixels no point covers show the floor (rays going down) or the walls.

World frame: z up, the floor at z = 0, the room [0, size] x [0, size]. A pose is (x, y, yaw), yaw the heading's
angle from +x.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple

import numpy as np

# name -> (mesh under pybullet_data, the mesh's up axis, box (width, depth, height) in metres, colour)
FURNITURE = {"table": ("table/table.obj", 2, (0.9, 0.6, 0.75), (0.55, 0.35, 0.15)),
             "shelf": ("kiva_shelf/meshes/pod_lowres.stl", 1, (0.8, 0.4, 1.6), (0.2, 0.3, 0.8)),
             "cabinet": ("cube.obj", 2, (0.7, 0.5, 0.9), (0.85, 0.85, 0.8)),
             "bin": ("toys/concave_box.obj", 2, (0.5, 0.5, 0.5), (0.2, 0.6, 0.25)),
             "desk": ("table_square/table.obj", 2, (1.0, 0.6, 0.7), (0.6, 0.1, 0.5))}
OBJECTS = {"mug": ("objects/mug.obj", 2, (0.15, 0.15, 0.15), (0.95, 0.1, 0.1)),
           "duck": ("duck.obj", 1, (0.2, 0.15, 0.18), (1.0, 0.9, 0.1)),
           "teddy": ("teddy2_VHACD_CHs.obj", 2, (0.2, 0.2, 0.25), (0.95, 0.55, 0.05)),
           "ball": ("soccerball.obj", 2, (0.2, 0.2, 0.2), (0.1, 0.9, 0.95)),
           "bunny": ("bunny.obj", 2, (0.2, 0.15, 0.2), (1.0, 0.55, 0.75)),
           "ring": ("torus/torus_textured.obj", 1, (0.2, 0.2, 0.06), (0.6, 1.0, 0.3))}
ACTIONS = ("move", "pick", "use")
FLOOR, WALL = (0.35, 0.35, 0.38), (0.75, 0.72, 0.65)


@dataclasses.dataclass(frozen=True)
class RoomConfig:
  size: float = 4.0  # metres
  n_furniture: int = 4  # of FURNITURE, in distinct wall slots (2 per wall)
  n_objects: int = 3  # of OBJECTS, on distinct furniture
  points_per_furniture: int = 96
  points_per_object: int = 24
  image_size: int = 32
  n_frames: int = 4
  fov_deg: float = 80.0
  eye_height: float = 1.4
  pitch_deg: float = 20.0  # the camera looks down by this angle
  stand_off: float = 0.9  # metres between the agent and the furniture it works at

  def __post_init__(self):
    if not 2 <= self.n_furniture <= len(FURNITURE) or not 2 <= self.n_objects <= min(len(OBJECTS), self.n_furniture):
      raise ValueError(f"RoomConfig: need 2 <= n_furniture <= {len(FURNITURE)} and 2 <= n_objects <= "
                       f"min({len(OBJECTS)}, n_furniture), found {self.n_furniture}, {self.n_objects}")
    if self.n_frames < 4 or self.image_size < 8:
      raise ValueError(f"RoomConfig: need n_frames >= 4 and image_size >= 8, found {self.n_frames}, "
                       f"{self.image_size}")

  @property
  def n_points(self) -> int:
    return self.n_furniture * self.points_per_furniture + self.n_objects * self.points_per_object


def data_path() -> str:
  import pybullet_data
  return pybullet_data.getDataPath()


@functools.lru_cache(maxsize=None)
def unit_points(mesh: str, up: int, n: int) -> np.ndarray:
  """[n, 3]: points sampled uniformly on the mesh's surface (seeded), its up axis made z, scaled into the unit
  box [-0.5, 0.5]^2 x [0, 1]."""
  import trimesh
  m = trimesh.load(os.path.join(data_path(), mesh), force="mesh")
  p = np.asarray(trimesh.sample.sample_surface(m, n, seed=0)[0], np.float64)
  p = p[:, [a for a in range(3) if a != up] + [up]]
  lo, hi = p.min(0), p.max(0)
  p = (p - lo) / np.maximum(hi - lo, 1e-9)
  return (p - np.array([0.5, 0.5, 0.0])).astype(np.float32)


def slots(size: float) -> list[tuple[float, float, float]]:
  """The 8 wall slots (x, y, yaw of the direction facing the wall from inside), 2 per wall."""
  a, b, m = size * 0.3, size * 0.7, 0.35
  return [(a, m, -np.pi / 2), (b, m, -np.pi / 2), (size - m, a, 0.0), (size - m, b, 0.0),
          (b, size - m, np.pi / 2), (a, size - m, np.pi / 2), (m, b, np.pi), (m, a, np.pi)]


class Piece(NamedTuple):
  name: str
  centre: tuple[float, float, float]  # of its box's base
  yaw: float  # the box's depth axis points along yaw (furniture: toward its wall)
  box: tuple[float, float, float]
  on: str = ""  # objects: the furniture they lie on


class Room(NamedTuple):
  furniture: list  # Piece
  objects: list  # Piece, at the clip's start
  action: str  # ACTIONS
  item: str  # the object the agent takes
  source: str  # the furniture it takes it from
  target: str  # where the agent ends: the furniture it puts the item on ("move") or `source`
  poses: np.ndarray  # [F, 3] (x, y, yaw) of every frame
  held: np.ndarray  # [F] bool: the item is in the agent's hand in that frame


def _piece_points(p: Piece, mesh: str, up: int, n: int) -> np.ndarray:
  c, s = np.cos(p.yaw), np.sin(p.yaw)
  u = unit_points(mesh, up, n) * np.asarray(p.box, np.float32)
  # box axes: width along (-sin, cos), depth along (cos, sin)
  xy = u[:, :1] * np.array([-s, c]) + u[:, 1:2] * np.array([c, s])
  return np.concatenate([xy + np.asarray(p.centre[:2]), u[:, 2:] + p.centre[2]], 1).astype(np.float32)


def stand_pose(f: Piece, cfg: RoomConfig) -> np.ndarray:
  """(x, y, yaw): `stand_off` in front of the furniture, facing it."""
  c, s = np.cos(f.yaw), np.sin(f.yaw)
  return np.array([f.centre[0] - cfg.stand_off * c, f.centre[1] - cfg.stand_off * s, f.yaw])


def _object_on(name: str, f: Piece, rng) -> Piece:
  box = OBJECTS[name][2]
  off = rng.uniform(-0.25, 0.25) * f.box[0]
  c, s = np.cos(f.yaw), np.sin(f.yaw)
  return Piece(name, (f.centre[0] - s * off, f.centre[1] + c * off, f.box[2]), float(rng.uniform(-np.pi, np.pi)),
               box, f.name)


def generate_room(cfg: RoomConfig, rng) -> Room:
  """One room with its clip, from the numpy Generator `rng`."""
  names = rng.choice(list(FURNITURE), cfg.n_furniture, replace=False)
  where = rng.choice(8, cfg.n_furniture, replace=False)
  sl = slots(cfg.size)
  furniture = [Piece(str(n), (sl[w][0], sl[w][1], 0.0), sl[w][2], FURNITURE[n][2]) for n, w in zip(names, where)]
  holders = rng.choice(cfg.n_furniture, cfg.n_objects, replace=False)
  objects = [_object_on(str(o), furniture[h], rng)
             for o, h in zip(rng.choice(list(OBJECTS), cfg.n_objects, replace=False), holders)]
  k = int(rng.integers(cfg.n_objects))
  action = str(ACTIONS[rng.integers(len(ACTIONS))])
  src = furniture[holders[k]]
  free = [f for i, f in enumerate(furniture) if i not in holders]
  dst = free[int(rng.integers(len(free)))] if action == "move" and free else src
  if dst is src:
    action = "pick" if action == "move" else action
  centre = np.array([cfg.size / 2, cfg.size / 2])
  a, b = stand_pose(src, cfg), stand_pose(dst, cfg)
  start = np.array([*centre, np.arctan2(*(a[:2] - centre)[::-1])])
  f = cfg.n_frames
  # frames: the start, then at the source (half of what is left), then the way to the target and the target
  n_src = max(1, (f - 2) // 2)
  poses = [start] + [a] * n_src
  rest = f - 1 - n_src
  for i in range(rest):
    if action == "move":
      t = (i + 1) / rest
      mid = a[:2] + t * (b[:2] - a[:2])
      yaw = b[2] if t == 1 else np.arctan2(*(b[:2] - a[:2])[::-1]) if np.linalg.norm(b[:2] - a[:2]) > 1e-6 else b[2]
      poses.append(np.array([*mid, yaw]))
    else:
      poses.append(a)
  if action == "pick":  # it turns back toward the room's centre with the item in hand
    poses[-1] = np.array([a[0], a[1], np.arctan2(*(centre - a[:2])[::-1])])
  held = np.zeros(f, bool)
  held[1 + n_src:] = True
  if action == "move":
    held[-1] = False
  elif action == "use":
    held[-1] = False
  return Room(furniture, objects, action, objects[k].name, src.name, dst.name, np.stack(poses), held)


def final_item(room: Room, cfg: RoomConfig) -> Piece | None:
  """Where the item is at the clip's end (None: in the agent's hand)."""
  if room.action == "pick":
    return None
  f = {p.name: p for p in room.furniture}[room.target]
  it = {p.name: p for p in room.objects}[room.item]
  if room.action == "use":
    return it
  return Piece(it.name, (f.centre[0], f.centre[1], f.box[2]), it.yaw, it.box, f.name)


def point_cloud(room: Room, cfg: RoomConfig, objects=None) -> tuple[np.ndarray, np.ndarray]:
  """(xyz [N, 3], rgb [N, 3]) of the furniture and the objects (default: where they lie at the clip's start)."""
  xyz, rgb = [], []
  for p in room.furniture:
    mesh, up, _, col = FURNITURE[p.name]
    xyz.append(_piece_points(p, mesh, up, cfg.points_per_furniture))
    rgb.append(np.broadcast_to(np.asarray(col, np.float32), (cfg.points_per_furniture, 3)))
  for p in room.objects if objects is None else objects:
    mesh, up, _, col = OBJECTS[p.name]
    xyz.append(_piece_points(p, mesh, up, cfg.points_per_object))
    rgb.append(np.broadcast_to(np.asarray(col, np.float32), (cfg.points_per_object, 3)))
  return np.concatenate(xyz), np.concatenate(rgb)


def camera(pose, cfg: RoomConfig) -> tuple[np.ndarray, np.ndarray]:
  """(c2w [4, 4], K [3, 3]) of the agent's eye at `pose` (x, y, yaw), looking down by `pitch_deg`."""
  yaw, pitch = float(pose[2]), np.deg2rad(cfg.pitch_deg)
  fwd = np.array([np.cos(pitch) * np.cos(yaw), np.cos(pitch) * np.sin(yaw), -np.sin(pitch)])
  right = np.array([np.sin(yaw), -np.cos(yaw), 0.0])
  down = np.cross(fwd, right)
  c2w = np.eye(4)
  c2w[:3, :3] = np.stack([right, down, fwd], 1)
  c2w[:3, 3] = [pose[0], pose[1], cfg.eye_height]
  f = cfg.image_size / 2 / np.tan(np.deg2rad(cfg.fov_deg) / 2)
  k = np.array([[f, 0, cfg.image_size / 2], [0, f, cfg.image_size / 2], [0, 0, 1.0]])
  return c2w, k


def project(xyz_N3, c2w, k) -> tuple[np.ndarray, np.ndarray]:
  """(uv [N, 2] continuous pixel coordinates, depth [N]) of world points."""
  cam = (np.asarray(xyz_N3, np.float64) - c2w[:3, 3]) @ c2w[:3, :3]
  z = cam[:, 2]
  uv = (cam @ k.T)[:, :2] / np.where(np.abs(z) < 1e-9, 1e-9, z)[:, None]
  return uv, z


def rasterize(xyz_N3, rgb_N3, c2w, k, size: int, splat: float = 1.5) -> np.ndarray:
  """[size, size, 3] float32: the points seen from the camera; a point covers the pixels within
  round(splat / depth) of its own, the nearest point wins; the rest is floor or wall."""
  uv, z = project(xyz_N3, c2w, k)
  front = z > 0.05
  uv, z, col = uv[front], z[front], np.asarray(rgb_N3, np.float32)[front]
  px = np.floor(uv).astype(np.int64)
  r = np.clip(np.round(splat / z), 0, 3).astype(np.int64)
  us, vs, zs, cs = [], [], [], []
  for dv in range(-3, 4):
    for du in range(-3, 4):
      m = (np.abs(du) <= r) & (np.abs(dv) <= r)
      us.append(px[m, 0] + du), vs.append(px[m, 1] + dv), zs.append(z[m]), cs.append(col[m])
  u, v, z, col = map(np.concatenate, (us, vs, zs, cs))
  ok = (u >= 0) & (u < size) & (v >= 0) & (v < size)
  u, v, z, col = u[ok], v[ok], z[ok], col[ok]
  img = background(c2w, k, size)
  if len(z):
    flat = v * size + u
    order = np.lexsort((z, flat))  # by pixel, nearest first
    first = order[np.unique(flat[order], return_index=True)[1]]
    img.reshape(-1, 3)[flat[first]] = col[first]
  return img


def background(c2w, k, size: int) -> np.ndarray:
  """[size, size, 3]: floor where a pixel's ray goes down, wall elsewhere."""
  ys, xs = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
  d = np.stack([(xs - k[0, 2]) / k[0, 0], (ys - k[1, 2]) / k[1, 1], np.ones_like(xs)], -1) @ c2w[:3, :3].T
  return np.where((d[..., 2] < 0)[..., None], np.asarray(FLOOR, np.float32),
                  np.asarray(WALL, np.float32)).astype(np.float32)


def held_points(pose, room: Room, cfg: RoomConfig) -> np.ndarray:
  """[n, 3]: the item's points in the agent's hand (0.45 m ahead, 0.5 m below the eye)."""
  yaw = float(pose[2])
  hand = Piece(room.item, (pose[0] + 0.45 * np.cos(yaw), pose[1] + 0.45 * np.sin(yaw), cfg.eye_height - 0.5),
               yaw, OBJECTS[room.item][2])
  return _piece_points(hand, OBJECTS[room.item][0], OBJECTS[room.item][1], cfg.points_per_object)


def render_clip(room: Room, cfg: RoomConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(frames [F, H, W, 3] in [0, 1], c2w [F, 4, 4], K [3, 3]): the clip, the item where it is in each frame."""
  others = [o for o in room.objects if o.name != room.item]
  item0 = next(o for o in room.objects if o.name == room.item)
  end = final_item(room, cfg)
  frames, c2ws, k = [], [], None
  for i, pose in enumerate(room.poses):
    c2w, k = camera(pose, cfg)
    put_down = i == len(room.poses) - 1 and not room.held[i] and end is not None
    objs = others + ([] if room.held[i] else [end if put_down else item0])
    xyz, rgb = point_cloud(room, cfg, objs)
    if room.held[i]:
      hp = held_points(pose, room, cfg)
      xyz = np.concatenate([xyz, hp])
      rgb = np.concatenate([rgb, np.broadcast_to(np.asarray(OBJECTS[room.item][3], np.float32), hp.shape)])
    frames.append(rasterize(xyz, rgb, c2w, k, cfg.image_size))
    c2ws.append(c2w)
  return np.stack(frames), np.stack(c2ws), k
