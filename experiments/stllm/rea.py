"""REA-style questions with exact answers over generated rooms and clips (STLLM, arXiv 2507.05258; see
experiments/stllm/__init__.py). The room is `experiments.stllm.rooms`' point cloud at the clip's start, the clip
its rendered frames. "now" is the agent's pose in the clip's last frame.

  relative_direction    "where is the Y from the agent now ?" -> left | right | front | back (Y: another object)
  relative_distance     "which is closer to the agent now , the A or the B ?" -> A | B (furniture)
  find_my_item          "where is the X now ?" -> "on the A" | "in its hand"
  furniture_affordance  "should the agent bring the X to the A or the B ?" -> "bring the X to the A" (the nearer)
  action_planning       "how does the agent get to the A ?" -> "turn left and walk to the A" | "turn right ..." |
                        "walk ahead to the A" | "turn around and walk to the A"

Every task but find_my_item needs both the room (where Y, A, B are) and the clip (where the agent ends);
find_my_item needs the clip only. The last three answers are free-form (scored also by BLEU-4 and ROUGE-L).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from experiments.stllm import rooms

TASKS = ("relative_direction", "relative_distance", "find_my_item", "furniture_affordance", "action_planning")
NEEDS_BOTH = ("relative_direction", "relative_distance", "furniture_affordance", "action_planning")
FREE_FORM = ("find_my_item", "furniture_affordance", "action_planning")
DIRECTIONS = ("front", "left", "back", "right")
SPECIALS = ("<pad>", "<bos>", "<eos>", "<image>", "<unk>")  # "<image>" holds the video's tokens
POINTS = "<points>"
WORDS = ("where", "is", "the", "from", "agent", "now", "?", "which", "closer", "to", ",", "or", "on", "in", "its",
         "hand", "should", "bring", "how", "does", "get", "turn", "and", "walk", "ahead", "around", "a")
MIN_GAP = 0.3  # metres: distance questions ask only about pairs whose distances differ by this much


class Question(NamedTuple):
  room: int  # index of the room / clip
  task: str
  question: str
  answer: str


def vocabulary() -> list[str]:
  return list(SPECIALS) + [POINTS] + list(WORDS) + list(DIRECTIONS) + list(rooms.FURNITURE) + list(rooms.OBJECTS)


def direction(pose, xy) -> str:
  """The side of the point `xy` seen from `pose` (x, y, yaw): the larger of its ahead and sideways parts."""
  v = np.asarray(xy[:2], np.float64) - pose[:2]
  ahead = v @ np.array([np.cos(pose[2]), np.sin(pose[2])])
  left = v @ np.array([-np.sin(pose[2]), np.cos(pose[2])])
  if abs(ahead) >= abs(left):
    return "front" if ahead >= 0 else "back"
  return "left" if left > 0 else "right"


def plan(side: str, name: str) -> str:
  return {"front": f"walk ahead to the {name}", "left": f"turn left and walk to the {name}",
          "right": f"turn right and walk to the {name}", "back": f"turn around and walk to the {name}"}[side]


def _pair(pose, furniture, rng):
  """Two furniture names (in random order) whose distances from `pose` differ by at least MIN_GAP (else the
  pair that differs most), and the nearer of the two."""
  d = {f.name: float(np.hypot(f.centre[0] - pose[0], f.centre[1] - pose[1])) for f in furniture}
  names = sorted(d)
  pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
  good = [p for p in pairs if abs(d[p[0]] - d[p[1]]) >= MIN_GAP] or [max(pairs, key=lambda p: abs(d[p[0]] - d[p[1]]))]
  a, b = good[int(rng.integers(len(good)))]
  if rng.random() < 0.5:
    a, b = b, a
  return a, b, (a if d[a] < d[b] else b)


def questions(room: rooms.Room, index: int, cfg: rooms.RoomConfig, rng) -> list[Question]:
  """One question per task about the room `index`."""
  pose = room.poses[-1]
  others = [o for o in room.objects if o.name != room.item]
  y = others[int(rng.integers(len(others)))]
  away = [f for f in room.furniture if f.name != room.target]
  out = [Question(index, "relative_direction", f"where is the {y.name} from the agent now ?",
                  direction(pose, y.centre))]
  a, b, near = _pair(pose, away, rng)
  out.append(Question(index, "relative_distance", f"which is closer to the agent now , the {a} or the {b} ?", near))
  end = rooms.final_item(room, cfg)
  out.append(Question(index, "find_my_item", f"where is the {room.item} now ?",
                      "in its hand" if end is None else f"on the {end.on}"))
  a, b, near = _pair(pose, away, rng)
  out.append(Question(index, "furniture_affordance", f"should the agent bring the {room.item} to the {a} or the {b} ?",
                      f"bring the {room.item} to the {near}"))
  f = away[int(rng.integers(len(away)))]
  out.append(Question(index, "action_planning", f"how does the agent get to the {f.name} ?",
                      plan(direction(pose, f.centre), f.name)))
  return out


class Data(NamedTuple):
  questions: list  # Question
  xyz: np.ndarray  # [R, N, 3] float32, padded
  rgb: np.ndarray  # [R, N, 3]
  mask: np.ndarray  # [R, N] bool
  frames: np.ndarray  # [R, F, H, W, 3] in [0, 1]
  c2w: np.ndarray  # [R, F, 4, 4]
  k: np.ndarray  # [R, 3, 3] float32: the frames' pinhole intrinsics, in their pixels
  rooms: list  # rooms.Room (empty for file data)


def generate(n_rooms: int, cfg: rooms.RoomConfig, seed: int) -> Data:
  """`n_rooms` rooms with their clips and five questions each."""
  rng = np.random.default_rng(seed)
  qs, xyz, rgb, frames, c2ws, ks, rs = [], [], [], [], [], [], []
  for i in range(n_rooms):
    room = rooms.generate_room(cfg, rng)
    p, c = rooms.point_cloud(room, cfg)
    f, c2w, k = rooms.render_clip(room, cfg)
    qs += questions(room, i, cfg, rng)
    xyz.append(p), rgb.append(c), frames.append(f), c2ws.append(c2w), ks.append(k), rs.append(room)
  xyz = np.stack(xyz)
  return Data(qs, xyz, np.stack(rgb), np.ones(xyz.shape[:2], bool), np.stack(frames).astype(np.float32),
              np.stack(c2ws).astype(np.float32), np.stack(ks).astype(np.float32), rs)


def scene_key(room: rooms.Room) -> dict:
  """What identifies a room and its clip: every piece's name, place (mm) and yaw (mrad), the action and its item."""
  piece = lambda p: [p.name, *(round(float(v), 3) for v in (*p.centre, p.yaw)), p.on]
  return {"furniture": [piece(f) for f in room.furniture], "objects": [piece(o) for o in room.objects],
          "action": room.action, "item": room.item, "source": room.source, "target": room.target}


def answers_by_task(qs: Sequence[Question]) -> dict[str, list[int]]:
  return {t: [i for i, q in enumerate(qs) if q.task == t] for t in TASKS}
