"""Sandbox: run an untrusted command (a model-written patch's tests, generated plotting code, a tool call).

The command sees its workdir at `/workdir` (read-write), a read-only runtime (/usr, this interpreter's prefixes,
the loader's and fontconfig's /etc files), fresh /proc, a fresh read-only /dev (its devices work) and a private
/tmp; nothing of the host's home, temp or the project. It runs without capabilities or new privileges, as uid
65534, in its own pid, network, ipc, uts and cgroup namespaces. `network=True` keeps the host's network (and its
resolver files).

Limits: wall clock (`timeout_s`: the sandbox's pid namespace is killed, and with it every process in it),
address space per process (`memory_mb`, RLIMIT_AS; /tmp and /dev/shm are tmpfs of that size), processes
(`max_procs`, RLIMIT_NPROC). stdout and stderr keep their first `MAX_OUTPUT_BYTES` bytes each; the rest is read and
dropped. Nothing outlives `run`: the pid namespace dies with its first process, which `run` waits for.

Backends: bubblewrap (Debian `bubblewrap`) and Docker (`docker_argv`, for task images that bring their own
runtime). Called as root, bwrap drops the command to host uid nobody (root ignores RLIMIT_NPROC), which then counts
every process of host uid nobody, and the workdir tree belongs to nobody during the call and to the workdir's owner
afterwards. Called as another user, bwrap maps that user to 65534 in a new user namespace (no nested ones), where
RLIMIT_NPROC counts the sandbox's processes; the caller's supplementary groups stay (a user namespace cannot drop
them; inside they read 65534), so run it as a user without groups that grant access to files it binds.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from typing import Mapping, NamedTuple, Sequence

from jaxlab import errors

NOBODY = 65534
WORKDIR = "/workdir"
MAX_OUTPUT_BYTES = 1 << 20
ETC_RUNTIME = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/fonts")
ETC_NETWORK = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates")


class Result(NamedTuple):
  """The command's exit status (bwrap's 128 + signal, or -signal, when killed) and its output, decoded as UTF-8."""
  returncode: int
  stdout: str
  stderr: str
  timed_out: bool


def runtime_paths() -> list[str]:
  """Host directories bound read-only at their own paths: /usr and this interpreter's prefixes."""
  prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)}
  return ["/usr"] + sorted(p for p in prefixes if not _within(p, "/usr"))


def _within(path: str, root: str) -> bool:
  return os.path.commonpath([path, root]) == root


def _parents(paths: Sequence[str]) -> list[str]:
  """The directories above `paths` (not /), parents first: bwrap would create them mode 0700."""
  out = set()
  for p in paths:
    while (p := os.path.dirname(p)) != "/":
      out.add(p)
  return sorted(out)


def _check(workdir: str, timeout_s: float, memory_mb: int, max_procs: int, env: Mapping[str, str] | None) -> str:
  if not (timeout_s > 0 and memory_mb > 0 and max_procs > 0):
    raise ValueError(f"sandbox limits must be positive: timeout_s={timeout_s}, memory_mb={memory_mb}, "
                     f"max_procs={max_procs}")
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"sandbox workdir {workdir!r} is not an existing directory")
  workdir = os.path.realpath(workdir)
  if any(_within(p, workdir) for p in runtime_paths()):
    raise ValueError(f"sandbox workdir {workdir!r} contains the runtime; give it a directory of its own")
  bad = [k for k, v in (env or {}).items() if not k or "=" in k or not isinstance(v, str)]
  if bad:
    raise ValueError(f"sandbox env names must be non-empty without '=' and values str; found {bad}")
  return workdir


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
  path = ":".join([os.path.join(sys.prefix, "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
  return {"PATH": path, "HOME": WORKDIR, "LANG": "C.UTF-8", **(env or {})}


def bwrap_argv(argv: Sequence[str], *, workdir: str, memory_mb: int, max_procs: int, network: bool = False,
               env: Mapping[str, str] | None = None, ro_paths: Sequence[str] = (), as_root: bool = True) -> list[str]:
  """The bubblewrap command line: limits set by prlimit inside the namespaces, then (as root) setpriv to nobody."""
  cmd = ["bwrap", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
  if as_root:
    cmd += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--cap-add", "CAP_SETUID",
            "--cap-add", "CAP_SETGID"] + ([] if network else ["--unshare-net"])
  else:
    cmd += ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    cmd += ["--share-net"] if network else []
  # The private /tmp goes first, so a runtime under the host's /tmp (a venv there) is bound on top of it.
  cmd += ["--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin", "--symlink", "usr/lib", "/lib",
          "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
          "--perms", "1777", "--size", str(memory_mb << 20), "--tmpfs", "/tmp",
          "--perms", "1777", "--size", str(memory_mb << 20), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
  binds = sorted(set(runtime_paths() + [os.path.realpath(p) for p in ro_paths]))
  etc = ETC_RUNTIME + (ETC_NETWORK if network else ())
  for d in _parents(binds + list(etc)):
    cmd += ["--perms", "0755", "--dir", d]
  for p in binds:
    cmd += ["--ro-bind", p, p]
  for p in etc:
    cmd += ["--ro-bind-try", p, p]
  cmd += ["--bind", workdir, WORKDIR, "--remount-ro", "/", "--chdir", WORKDIR, "--clearenv"]
  for k, v in _environment(env).items():
    cmd += ["--setenv", k, v]
  limits = ["/usr/bin/prlimit", f"--as={memory_mb << 20}", f"--nproc={max_procs}", "--core=0", "--"]
  drop = ["/usr/bin/setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs",
          "--inh-caps=-all", "--bounding-set=-all", "--"]
  return cmd + ["--"] + limits + (drop if as_root else []) + list(argv)


def docker_argv(image: str, argv: Sequence[str], *, workdir: str, timeout_s: float, memory_mb: int,
                network: bool = False, env: Mapping[str, str] | None = None, max_procs: int = 64,
                name: str | None = None, user: str = f"{NOBODY}:{NOBODY}") -> list[str]:
  """The `docker run` command line: the same limits, the image's own runtime, the workdir at /workdir.

  `timeout_s` is validated here and enforced by `run`, which `docker kill`s the container (`name`) when it expires.
  """
  _check(workdir, timeout_s, memory_mb, max_procs, env)
  cmd = ["docker", "run", "--rm", "--name", name or f"jaxlab-sandbox-{uuid.uuid4().hex[:12]}",
         "--network", "host" if network else "none", "--memory", f"{memory_mb}m", "--memory-swap", f"{memory_mb}m",
         "--pids-limit", str(max_procs), "--read-only", "--tmpfs", f"/tmp:rw,nosuid,size={memory_mb}m,mode=1777",
         "--user", user, "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--ulimit", "core=0",
         "-v", f"{os.path.realpath(workdir)}:{WORKDIR}", "-w", WORKDIR]
  for k, v in {"HOME": WORKDIR, "LANG": "C.UTF-8", **(env or {})}.items():
    cmd += ["-e", f"{k}={v}"]
  return cmd + [image] + list(argv)


def _chown_tree(root: str, uid: int, gid: int) -> None:
  os.lchown(root, uid, gid)
  for d, dirs, files in os.walk(root):
    for n in dirs + files:
      os.lchown(os.path.join(d, n), uid, gid)


def _drain(stream, out: bytearray) -> None:
  while chunk := stream.read(1 << 16):
    out += chunk[:MAX_OUTPUT_BYTES - len(out)]


def _execute(cmd: list[str], timeout_s: float, kill, pass_fds: Sequence[int] = ()) -> Result:
  """Runs `cmd` with capped output; on timeout calls `kill(proc)`, which must end every process it started."""
  try:
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=pass_fds, start_new_session=True)
  finally:
    for fd in pass_fds:
      os.close(fd)
  outs = (bytearray(), bytearray())
  readers = [threading.Thread(target=_drain, args=io, daemon=True) for io in zip((proc.stdout, proc.stderr), outs)]
  for t in readers:
    t.start()
  try:
    proc.wait(timeout=timeout_s)
    timed_out = False
  except subprocess.TimeoutExpired:
    timed_out = True
    kill(proc)
    proc.wait()
  for t in readers:
    t.join()
  text = [bytes(o).decode("utf-8", errors="replace") for o in outs]
  return Result(proc.returncode, text[0], text[1], timed_out)


def _kill_namespace(info_fd: int):
  """Kills the pid namespace's first process, whose pid bwrap wrote on `info_fd`: the kernel kills the rest before
  that process (and then bwrap) exits. Without it, kills bwrap, whose death kills the namespace (--die-with-parent)."""
  def kill(proc):
    os.set_blocking(info_fd, False)
    try:
      child = json.loads(os.read(info_fd, 4096) or b"{}").get("child-pid")
    except (BlockingIOError, ValueError):
      child = None
    if child:
      os.kill(child, signal.SIGKILL)
    else:
      os.killpg(proc.pid, signal.SIGKILL)
  return kill


def run(argv: Sequence[str], *, workdir: str, timeout_s: float, memory_mb: int, network: bool = False,
        env: Mapping[str, str] | None = None, max_procs: int = 64, ro_paths: Sequence[str] = (),
        backend: str = "bwrap", image: str | None = None) -> Result:
  """Runs `argv` in the sandbox and returns its exit status, capped output and whether it ran out of time.

  Args:
    argv: the command; looked up on the sandbox's PATH (this interpreter's bin, then /usr's).
    workdir: an existing host directory, the command's read-write /workdir (its HOME and cwd).
    timeout_s, memory_mb, max_procs: wall clock, address space per process and process count.
    network: keep the host's network instead of an empty network namespace.
    env: variables added to PATH, HOME and LANG (the rest of the host environment is not passed).
    ro_paths: further host directories bound read-only at their own paths (bwrap only).
    backend: "bwrap" or "docker" (then `image` names the image that holds the runtime).

  Raises:
    jaxlab.errors.MissingDependency: bwrap (for backend="docker": the docker CLI) is not installed.
    FileNotFoundError, ValueError: a missing workdir or ro_path, non-positive limits, a malformed env, no image.
  """
  workdir = _check(workdir, timeout_s, memory_mb, max_procs, env)
  root = os.geteuid() == 0
  if backend == "docker":
    if not image:
      raise ValueError(f"the docker sandbox needs an image; image={image!r}")
    errors.require("docker", "the Docker sandbox")
    name = f"jaxlab-sandbox-{uuid.uuid4().hex[:12]}"
    user = f"{NOBODY}:{NOBODY}" if root else f"{os.getuid()}:{os.getgid()}"
    cmd = docker_argv(image, argv, workdir=workdir, timeout_s=timeout_s, memory_mb=memory_mb, network=network,
                      env=env, max_procs=max_procs, name=name, user=user)
    def kill(proc):
      subprocess.run(["docker", "kill", name], capture_output=True)
      os.killpg(proc.pid, signal.SIGKILL)
    return _as_nobody(workdir, root, lambda: _execute(cmd, timeout_s, kill))
  if backend != "bwrap":
    raise ValueError(f"sandbox backend must be 'bwrap' or 'docker', found {backend!r}")
  errors.require("bwrap", "the sandbox")
  missing = [p for p in ro_paths if not os.path.isdir(p)]
  if missing:
    raise FileNotFoundError(f"sandbox ro_paths {missing} are not existing directories")
  cmd = bwrap_argv(argv, workdir=workdir, memory_mb=memory_mb, max_procs=max_procs, network=network, env=env,
                   ro_paths=ro_paths, as_root=root)

  def execute():
    info_r, info_w = os.pipe()
    try:
      return _execute(cmd[:1] + ["--info-fd", str(info_w)] + cmd[1:], timeout_s, _kill_namespace(info_r), (info_w,))
    finally:
      os.close(info_r)
  return _as_nobody(workdir, root, execute)


def _as_nobody(workdir: str, chown: bool, execute) -> Result:
  """Calls `execute` with the workdir tree owned by nobody (when `chown`), then gives it back to its owner."""
  if not chown:
    return execute()
  owner = os.stat(workdir)
  _chown_tree(workdir, NOBODY, NOBODY)
  try:
    return execute()
  finally:
    _chown_tree(workdir, owner.st_uid, owner.st_gid)
