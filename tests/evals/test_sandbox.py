"""Sandbox: each escape attempt is contained (network, host files, writes, fork bomb, memory, time, leftovers, uid)."""
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from jaxlab import errors
from jaxlab.evals import sandbox


def py(workdir, code, **kw):
  kw = {"timeout_s": 20, "memory_mb": 512, **kw}
  return sandbox.run(["python", "-c", textwrap.dedent(code)], workdir=str(workdir), **kw)


def host_pids_running(marker):
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if marker in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
        found.append(pid)
    except OSError:
      pass
  return found


@pytest.mark.sandbox
def test_runs_in_workdir_and_gives_it_back(tmp_path):
  (tmp_path / "in.txt").write_text("given")
  r = py(tmp_path, "import os; print(os.getcwd(), open('in.txt').read()); open('out.txt', 'w').write('made')")
  assert r == sandbox.Result(0, "/workdir given\n", "", False)
  assert (tmp_path / "out.txt").read_text() == "made"
  assert {p.stat().st_uid for p in [tmp_path, *tmp_path.iterdir()]} == {os.getuid()}


@pytest.mark.sandbox
def test_host_loopback_unreachable(tmp_path):
  with socket.socket() as srv:
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    code = f"import socket; socket.create_connection(('127.0.0.1', {srv.getsockname()[1]}), timeout=3); print('in')"
    r = py(tmp_path, code)
    assert r.returncode != 0 and "in" not in r.stdout and "ConnectionRefused" in r.stderr
    assert py(tmp_path, code, network=True).stdout == "in\n"  # the same connection without the sandbox's netns


@pytest.mark.sandbox
def test_host_home_temp_and_project_unreadable(tmp_path):
  with tempfile.NamedTemporaryFile(dir=pathlib.Path.home()) as home, tempfile.NamedTemporaryFile() as tmp:
    secrets = [home.name, tmp.name, str(pathlib.Path(__file__).resolve()), "/etc/passwd", "/etc/hostname"]
    r = py(tmp_path, f"""
      import os
      for p in {secrets!r} + ['/proc/1/root/etc/passwd']:
        try:
          open(p).read(); print('read', p)
        except OSError as e:
          print(type(e).__name__)
      print(sorted(os.listdir('/tmp')), sorted(os.listdir('/')))
      """)
  assert r.returncode == 0 and "read" not in r.stdout, r
  tops = {p.split("/")[1] for p in sandbox.runtime_paths()}
  top_level = sorted({"bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "workdir"} | tops)
  in_tmp = sorted({p.split("/")[2] for p in sandbox.runtime_paths() if p.startswith("/tmp/")})  # a venv there
  assert r.stdout.splitlines()[-1] == f"{in_tmp} {top_level}"


@pytest.mark.sandbox
def test_writes_outside_workdir_fail(tmp_path):
  work = tmp_path / "work"
  work.mkdir()
  targets = ["/x", "/usr/x", "/etc/x", f"{sys.prefix}/x", "/workdir/../x", "/dev/x", "/proc/x", str(tmp_path / "x")]
  r = py(work, f"""
    for p in {targets!r}:
      try:
        open(p, 'w').write('escaped'); print('wrote', p)
      except OSError as e:
        print(type(e).__name__)
    open('/tmp/scratch', 'w').write('inside')
    """)
  assert r.returncode == 0 and "wrote" not in r.stdout, r
  assert not any(os.path.exists(p) for p in ["/x", "/usr/x", "/etc/x", f"{sys.prefix}/x", str(tmp_path / "x")])
  assert list(work.iterdir()) == []


@pytest.mark.sandbox
def test_fork_bomb_bounded(tmp_path):
  r = py(tmp_path, """
    import os, time
    n = 0
    try:
      while True:
        if os.fork() == 0:
          time.sleep(30); os._exit(0)
        n += 1
    except OSError as e:
      print(n, e.errno)
    """, max_procs=32, timeout_s=20)
  forked, errno = map(int, r.stdout.split())
  assert not r.timed_out and 0 < forked < 32 and errno == 11, r
  assert subprocess.run(["true"]).returncode == 0  # the host still forks


@pytest.mark.sandbox
def test_allocation_past_the_limit_fails(tmp_path):
  code = "b = bytearray({} << 20); print('got', len(b) >> 20)"
  assert py(tmp_path, code.format(64), memory_mb=256).stdout == "got 64\n"
  r = py(tmp_path, code.format(1024), memory_mb=256)
  assert r.returncode != 0 and "MemoryError" in r.stderr and "got" not in r.stdout


@pytest.mark.sandbox
def test_sleep_past_the_timeout_is_killed(tmp_path):
  start = time.monotonic()
  r = py(tmp_path, "import os, time; os.system('sleep 986.5 &'); print('up', flush=True); time.sleep(60)", timeout_s=2)
  assert r.timed_out and r.stdout == "up\n" and time.monotonic() - start < 10
  assert host_pids_running(b"986.5") == []


@pytest.mark.sandbox
def test_background_process_does_not_survive(tmp_path):
  r = py(tmp_path, "import subprocess; subprocess.Popen(['sleep', '987.5'], start_new_session=True); print('left')")
  assert r == sandbox.Result(0, "left\n", "", False)
  assert host_pids_running(b"987.5") == []


@pytest.mark.sandbox
def test_unprivileged_uid_and_empty_environment(tmp_path, monkeypatch):
  monkeypatch.setenv("HOST_SECRET", "x")
  r = py(tmp_path, """
    import os
    status = dict(l.split(':', 1) for l in open('/proc/self/status'))
    print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups(), status['CapEff'].strip(), status['CapBnd'].strip(),
          status['NoNewPrivs'].strip())
    print(sorted(os.environ.items()))
    """, env={"EXTRA": "1"})
  ids, env = r.stdout.splitlines()
  # called by another user than root, its supplementary groups stay, unmapped (a user namespace cannot drop them)
  groups = [] if os.geteuid() == 0 else [sandbox.NOBODY] * len(os.getgroups())
  assert ids == f"65534 65534 65534 {groups} 0000000000000000 0000000000000000 1", r
  assert dict(eval(env)) == {"EXTRA": "1", "HOME": "/workdir", "LANG": "C.UTF-8", "PWD": "/workdir",
                             "PATH": f"{sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin"}


@pytest.mark.sandbox
def test_output_is_capped(tmp_path):
  r = py(tmp_path, "import sys; sys.stdout.write('x' * (3 << 20)); sys.stderr.write('e')")
  assert r.returncode == 0 and r.stdout == "x" * sandbox.MAX_OUTPUT_BYTES and r.stderr == "e"


def test_clear_errors(tmp_path, monkeypatch):
  args = {"workdir": str(tmp_path), "timeout_s": 1, "memory_mb": 64}
  with pytest.raises(FileNotFoundError, match="workdir"):
    sandbox.run(["true"], **{**args, "workdir": str(tmp_path / "missing")})
  with pytest.raises(ValueError, match="positive"):
    sandbox.run(["true"], **{**args, "memory_mb": 0})
  with pytest.raises(ValueError, match="contains the runtime"):
    sandbox.run(["true"], **{**args, "workdir": "/"})
  with pytest.raises(ValueError, match="env"):
    sandbox.run(["true"], **args, env={"A=B": "1"})
  with pytest.raises(ValueError, match="backend"):
    sandbox.run(["true"], **args, backend="chroot")
  with pytest.raises(ValueError, match="needs an image"):
    sandbox.run(["true"], **args, backend="docker")
  monkeypatch.setenv("PATH", str(tmp_path))
  with pytest.raises(errors.MissingDependency, match=r"^the sandbox needs bubblewrap \(not installed\): apt-get "
                                                   r"install -y bubblewrap$"):
    sandbox.run(["true"], **args)
  with pytest.raises(errors.MissingDependency, match=r"Docker sandbox needs docker.io .*apt-get install -y docker.io"):
    sandbox.run(["true"], **args, backend="docker", image="python:3.11")


NON_ROOT_CALLER = '''
import json, os, socket, sandbox
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
code = """
import os, socket, time
print(os.getuid())
for p in ['/x', '/usr/x', '/etc/x']:
  try:
    open(p, 'w'); print('wrote', p)
  except OSError:
    pass
try:
  socket.create_connection(('127.0.0.1', PORT), timeout=3); print('connected')
except OSError:
  pass
open('made', 'w').write('x')
n = 0
try:
  while True:
    if os.fork() == 0:
      time.sleep(30); os._exit(0)
    n += 1
except OSError:
  print(n)
""".replace("PORT", str(srv.getsockname()[1]))
r = sandbox.run(["python3", "-c", code], workdir="work", timeout_s=20, memory_mb=256, max_procs=16)
u = sandbox.run(["unshare", "--user", "true"], workdir="work", timeout_s=20, memory_mb=256)
print(json.dumps([r._asdict(), u.returncode, os.stat("work/made").st_uid]))
'''


@pytest.mark.sandbox
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs /usr/bin/python3 for the non-root caller")
def test_non_root_caller_contained():
  """The sandbox called by a user other than root: nobody when the tests run as root, else the tests' own user."""
  root = os.geteuid() == 0
  caller = sandbox.NOBODY if root else os.geteuid()
  base = tempfile.mkdtemp()  # the module and jaxlab.errors, which it imports, copied where the caller can read them
  try:
    os.mkdir(f"{base}/jaxlab")
    shutil.copy(sandbox.__file__, base)
    shutil.copy(errors.__file__, f"{base}/jaxlab")
    pathlib.Path(f"{base}/jaxlab/__init__.py").touch()
    os.mkdir(f"{base}/work")
    if root:
      sandbox._chown_tree(base, caller, caller)
    drop = ["setpriv", f"--reuid={caller}", f"--regid={caller}", "--clear-groups"] if root else []
    out = subprocess.run(drop + ["/usr/bin/python3", "-c", NON_ROOT_CALLER], cwd=base, capture_output=True,
                         text=True, timeout=60)
    r, unshare_rc, owner = json.loads(out.stdout or "[{}, 0, 0]")
  finally:
    shutil.rmtree(base)
  lines = r.get("stdout", "").split()
  assert r.get("returncode") == 0 and len(lines) == 2 and lines[0] == "65534" and 0 < int(lines[1]) < 16, (
      r, out.stderr)
  assert unshare_rc != 0 and owner == caller  # no nested user namespace; files belong to the caller


def test_docker_argv(tmp_path):
  cmd = sandbox.docker_argv("susvibes/task:1", ["pytest", "-q"], workdir=str(tmp_path), timeout_s=60, memory_mb=2048,
                            env={"K": "v"}, max_procs=128, name="box")
  assert cmd[:5] == ["docker", "run", "--rm", "--name", "box"]
  assert cmd[-3:] == ["susvibes/task:1", "pytest", "-q"]
  pairs = set(zip(cmd, cmd[1:]))
  assert {("--network", "none"), ("--memory", "2048m"), ("--memory-swap", "2048m"), ("--pids-limit", "128"),
          ("--user", "65534:65534"), ("--cap-drop", "ALL"), ("--security-opt", "no-new-privileges"),
          ("-v", f"{tmp_path}:/workdir"), ("-w", "/workdir"), ("-e", "K=v"), ("-e", "HOME=/workdir")} <= pairs
  assert "--read-only" in cmd and not any(a.startswith("--privileged") for a in cmd)
  online = sandbox.docker_argv("i", ["true"], workdir=str(tmp_path), timeout_s=1, memory_mb=1, network=True)
  assert ("--network", "host") in set(zip(online, online[1:]))
