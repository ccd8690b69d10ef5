"""air_eval_kit: helpers shared by the evaluate.py scripts of the bundled air tasks.

The harness copies this file next to a task's evaluate.py (as /srv/air/eval/air_eval_kit.py), so it
must stay a single self-contained module that depends on the standard library only.

What it offers
--------------
* ``paths(task_dir)``              -> Paths(submission, secret, data, metrics_file) read from the
                                      AIR_* environment variables, with host-friendly defaults.
* ``run_evaluation(fn, task_dir)`` -> run ``fn(paths) -> dict`` and write the metrics file; turn a
                                      SubmissionError into a one-paragraph stderr message + exit 3.
* ``UntrustedModule``              -> import and call code from the submission in a separate,
                                      unprivileged subprocess (the agent's uid when we are root) over a
                                      JSON-lines protocol, with per-call and total timeouts and batching.
* ``read_submission_bytes`` / ``read_submission_csv`` -> read a submission file without following
                                      symlinks and with a size cap.
* ``write_metrics(metrics, path)`` -> validate (finite floats) and write the metrics JSON.

Errors: everything that is the submission's fault is a ``SubmissionError`` (the untrusted-code
errors ``UntrustedCrash``, ``UntrustedTimeout`` and ``UntrustedProtocolError`` are subclasses).
Anything else is a bug or a broken environment and ends the evaluation with exit code 2.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterable, NamedTuple, Sequence

__all__ = [
    "Paths", "paths", "run_evaluation", "write_metrics", "fail",
    "SubmissionError", "UntrustedCodeError", "UntrustedCrash", "UntrustedTimeout",
    "UntrustedProtocolError", "KitError", "UntrustedModule", "stage_submission",
    "read_submission_bytes", "read_submission_csv", "give_tree_to_agent", "AGENT_UID", "AGENT_GID",
]

# The agent's uid in the sandbox the evaluation runs in: every sandbox has its own (air passes it), 1000 elsewhere.
AGENT_UID = AGENT_GID = int(os.environ.get("AIR_AGENT_UID", "1000"))


# --------------------------------------------------------------------------- errors

def derived_seed(seed: int, purpose: str) -> int:
    """A 32-bit seed for `purpose` (e.g. the submitted code's `random`) that tells nothing about `seed`: code given a
    seed can read it back from its random state (numpy's first state word is the seed itself), and a hidden
    evaluation seed must not reach it."""
    return int.from_bytes(hashlib.sha256(f"{purpose}:{seed}".encode()).digest()[:4], "big")


class SubmissionError(Exception):
    """The submission is invalid or its code misbehaved; the message is shown to the agent."""


class UntrustedCodeError(SubmissionError):
    """Base class for failures of code from the submission run through UntrustedModule."""

    def __init__(self, message: str, stderr_tail: str = ""):
        self.stderr_tail = stderr_tail
        if stderr_tail.strip():
            message = f"{message}\n--- last output of your code (stderr) ---\n{stderr_tail.rstrip()}"
        super().__init__(message)


class UntrustedCrash(UntrustedCodeError):
    """The untrusted code raised an exception, failed to import, or its process died."""


class UntrustedTimeout(UntrustedCodeError):
    """The untrusted code exceeded a per-call, import or total time limit."""


class UntrustedProtocolError(UntrustedCodeError):
    """The untrusted process returned something that is not a valid protocol message."""


class KitError(RuntimeError):
    """The evaluation environment itself is broken (not the submission's fault)."""


# --------------------------------------------------------------------------- paths & metrics

class Paths(NamedTuple):
    submission: str
    secret: str
    data: str
    metrics_file: str


def paths(task_dir: str | None = None) -> Paths:
    """Read AIR_SUBMISSION_DIR, AIR_SECRET_DIR, AIR_DATA_DIR and AIR_METRICS_FILE.

    Defaults (for running on a host from a task directory): ``<task_dir>/_submission``,
    ``<task_dir>/secret``, ``<task_dir>/data`` and ``<task_dir>/_output/metrics.json``, where
    task_dir defaults to the directory of the running script.
    """
    if task_dir is None:
        task_dir = os.path.dirname(os.path.abspath(sys.argv[0]))
    env = os.environ
    return Paths(
        submission=env.get("AIR_SUBMISSION_DIR") or os.path.join(task_dir, "_submission"),
        secret=env.get("AIR_SECRET_DIR") or os.path.join(task_dir, "secret"),
        data=env.get("AIR_DATA_DIR") or os.path.join(task_dir, "data"),
        metrics_file=env.get("AIR_METRICS_FILE") or os.path.join(task_dir, "_output", "metrics.json"),
    )


def write_metrics(metrics: dict, path: str) -> dict:
    """Write ``metrics`` ({name: finite float}) as a JSON object to ``path`` and return it."""
    clean = {}
    for name, value in metrics.items():
        value = float(value)
        if not math.isfinite(value):
            raise SubmissionError(f"metric {name!r} is not finite ({value}); the submission produced invalid values")
        clean[str(name)] = value
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(clean, fh)
    os.replace(tmp, path)
    return clean


# Exit codes read by the harness. A bad submission gets its own code: Python exits 1 on any uncaught exception,
# so 1 would make a crashing evaluation look like the agent's fault.
EXIT_BAD_SUBMISSION = 3
EXIT_INTERNAL = 2


def fail(reason: str, code: int = EXIT_BAD_SUBMISSION) -> None:
    """Print a one-paragraph reason to stderr and exit with ``code``."""
    sys.stderr.write(reason.rstrip() + "\n")
    sys.stderr.flush()
    sys.exit(code)


def run_evaluation(evaluate: Callable[[Paths], dict], task_dir: str | None = None) -> None:
    """Entry point helper for evaluate.py: ``run_evaluation(lambda p: {...})``.

    Writes the metrics file and exits 0 on success; exits 3 with the message on SubmissionError;
    exits 2 on any other exception (printing only its type and message, never a traceback, so that
    code from the secret directory is not echoed).
    """
    p = paths(task_dir)
    try:
        metrics = evaluate(p)
        if not isinstance(metrics, dict) or not metrics:
            raise KitError("evaluate() must return a non-empty dict of metrics")
        metrics = write_metrics(metrics, p.metrics_file)
    except SubmissionError as exc:
        fail(f"Invalid submission: {exc}", EXIT_BAD_SUBMISSION)
    except KeyboardInterrupt:
        fail("Evaluation interrupted.", EXIT_INTERNAL)
    except Exception as exc:  # noqa: BLE001
        msg = str(exc)
        if len(msg) > 500:
            msg = msg[:500] + "..."
        fail(f"Internal evaluation error ({type(exc).__name__}): {msg}", EXIT_INTERNAL)
    print(json.dumps(metrics))


# --------------------------------------------------------------------------- reading submission files

def _inside(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def read_submission_bytes(submission_dir: str, relpath: str, max_bytes: int = 50 * 2**20) -> bytes:
    """Return the content of ``submission_dir/relpath``.

    Refuses symlinks (anywhere below submission_dir), non-regular files, files larger than
    ``max_bytes`` and paths that escape the submission directory; raises SubmissionError.
    """
    path = os.path.join(submission_dir, relpath)
    # Every component below submission_dir must be a real directory/file, not a link.
    cur = submission_dir
    for part in os.path.normpath(relpath).split(os.sep):
        if part in ("", ".", ".."):
            raise SubmissionError(f"invalid submission path {relpath!r}")
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            raise SubmissionError(f"required file {relpath!r} is missing from the submission") from None
        if stat.S_ISLNK(st.st_mode):
            raise SubmissionError(f"{relpath!r} is a symbolic link; submit a regular file")
    if not _inside(submission_dir, path):
        raise SubmissionError(f"{relpath!r} points outside the submission")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise SubmissionError(f"cannot open {relpath!r}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SubmissionError(f"{relpath!r} is not a regular file")
        if st.st_size > max_bytes:
            raise SubmissionError(
                f"{relpath!r} is {st.st_size} bytes, more than the limit of {max_bytes} bytes")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise SubmissionError(f"{relpath!r} is larger than the limit of {max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_submission_csv(submission_dir: str, relpath: str, required_columns: Sequence[str],
                        max_bytes: int = 20 * 2**20, allow_extra_columns: bool = False):
    """Parse a CSV from the submission with pandas (all columns as strings).

    Checks that ``required_columns`` are present (and, unless allowed, no other columns), that there
    are no duplicate column names and no empty cells in the required columns.
    """
    import pandas as pd  # local import: only CSV tasks need pandas

    raw = read_submission_bytes(submission_dir, relpath, max_bytes)
    if not raw.strip():
        raise SubmissionError(f"{relpath!r} is empty")
    try:
        df = pd.read_csv(io.BytesIO(raw), dtype=str, keep_default_na=False, na_values=[])
    except Exception as exc:  # noqa: BLE001
        raise SubmissionError(f"{relpath!r} is not a readable CSV file "
                              f"({type(exc).__name__}: {str(exc)[:200]})") from None
    cols = [str(c).strip() for c in df.columns]
    if len(set(cols)) != len(cols):
        raise SubmissionError(f"{relpath!r} has duplicate column names: {cols}")
    df.columns = cols
    missing = [c for c in required_columns if c not in cols]
    if missing:
        raise SubmissionError(
            f"{relpath!r} must have the columns {list(required_columns)}; missing {missing} (found {cols[:20]})")
    extra = [c for c in cols if c not in required_columns]
    if extra and not allow_extra_columns:
        raise SubmissionError(f"{relpath!r} has unexpected columns {extra[:20]}; "
                              f"expected exactly {list(required_columns)}")
    df = df[list(required_columns)]
    for c in required_columns:
        vals = df[c].astype(str).str.strip()
        empty = (vals == "") | vals.str.lower().isin(["nan", "none", "null", "na", "<na>"])
        if empty.any():
            row = int(empty.to_numpy().nonzero()[0][0])
            raise SubmissionError(f"{relpath!r}: column {c!r} has an empty/NaN value (first at data row {row + 1})")
        df[c] = vals
    return df


# --------------------------------------------------------------------------- staging

def stage_submission(src: str, dst: str | None = None, max_total_bytes: int = 1 << 30,
                     max_files: int = 20000, give_to_agent: bool = True) -> str:
    """Copy the submission tree ``src`` into a fresh private directory owned by the agent user.

    Symlinks, devices, sockets and FIFOs are skipped silently (never followed). Raises SubmissionError when
    the submission exceeds ``max_total_bytes`` or ``max_files``. Returns the directory.
    """
    src = os.path.abspath(src)
    if not os.path.isdir(src) or os.path.islink(src):
        raise KitError(f"submission directory {src} does not exist")
    created = dst is None
    if dst is None:
        dst = tempfile.mkdtemp(prefix="air_untrusted_")
    try:
        _copy_regular_tree(src, dst, max_total_bytes, max_files)
    except BaseException:
        if created:
            shutil.rmtree(dst, ignore_errors=True)
        raise
    os.chmod(dst, 0o700)
    if give_to_agent:
        give_tree_to_agent(dst)
    return dst


def give_tree_to_agent(path: str) -> None:
    """chown a staged tree to the agent user (only when running as root).

    Done last so that root needs CAP_CHOWN only (not CAP_FOWNER / CAP_DAC_OVERRIDE)."""
    if os.getuid() != 0:
        return
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), AGENT_UID, AGENT_GID)
    os.chown(path, AGENT_UID, AGENT_GID)


def _copy_regular_tree(src: str, dst: str, max_total_bytes: int, max_files: int) -> None:
    total = 0
    count = 0
    for root, dirs, files in os.walk(src, followlinks=False):
        rel = os.path.relpath(root, src)
        target_root = dst if rel == "." else os.path.join(dst, rel)
        keep_dirs = []
        for d in dirs:
            if not os.path.islink(os.path.join(root, d)):
                keep_dirs.append(d)
                os.makedirs(os.path.join(target_root, d), exist_ok=True)
        dirs[:] = keep_dirs
        for f in files:
            sp = os.path.join(root, f)
            st = os.lstat(sp)
            if not stat.S_ISREG(st.st_mode):
                continue
            count += 1
            total += st.st_size
            if count > max_files:
                raise SubmissionError(f"the submission has more than {max_files} files")
            if total > max_total_bytes:
                raise SubmissionError(f"the submission is larger than {max_total_bytes} bytes")
            fd = os.open(sp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as fin, open(os.path.join(target_root, f), "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)


# --------------------------------------------------------------------------- untrusted code runner

# Bootstrap executed by the child interpreter (python -s -B -c BOOTSTRAP <json-config>).
_BOOTSTRAP = r'''
import json, os, sys, traceback
cfg = json.loads(sys.argv[1])
os.chdir(cfg["workdir"])  # done here, after the uid switch, not by Popen(cwd=...) as root
# Talk to the parent over private copies of fd 0/1; route fd 1 and sys.stdout to stderr and
# fd 0 to /dev/null so prints of the untrusted code cannot corrupt the protocol.
_pin = os.fdopen(os.dup(0), "rb")
_pout = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdout = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
sys.stdin = open(os.devnull)
try:  # if memory runs out, the kernel should kill this process rather than the evaluator
    with open("/proc/self/oom_score_adj", "w") as _fh:
        _fh.write("1000")
except OSError:
    pass
try:
    import resource
    for _name, _val in (("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", cfg["max_file_bytes"]),
                        ("RLIMIT_NPROC", cfg["max_procs"])):
        if _val is None or not hasattr(resource, _name):
            continue
        _lim = getattr(resource, _name)
        _soft, _hard = resource.getrlimit(_lim)
        _new = _val if _hard == resource.RLIM_INFINITY else min(_val, _hard)
        try:
            resource.setrlimit(_lim, (_new, _new))
        except (ValueError, OSError):
            pass
    if cfg.get("memory_bytes"):
        try:
            resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_bytes"], cfg["memory_bytes"]))
        except (ValueError, OSError):
            pass
except ImportError:
    pass

def _send(obj):
    try:
        data = json.dumps(obj, default=_default, allow_nan=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        data = json.dumps({"ok": False, "kind": "protocol",
                           "error": "the result is not JSON-serialisable: %s" % exc})
    _pout.write(data.encode("utf-8") + b"\n")

def _default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError("object of type %s is not JSON serialisable" % type(o).__name__)

def _tb():
    etype, exc, tb = sys.exc_info()
    frames = [f for f in traceback.extract_tb(tb)
              if not (f.filename == "<string>" or f.filename.startswith("<frozen")
                      or f.filename.endswith(os.path.join("importlib", "__init__.py")))]
    lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames[-12:])
    return "".join(lines + traceback.format_exception_only(etype, exc))

import random
random.seed(cfg["seed"])
try:
    import numpy as _np
    _np.random.seed(cfg["seed"] % (2**32))
except Exception:
    _np = None
sys.path.insert(0, os.getcwd())
try:
    import importlib
    mod = importlib.import_module(cfg["module"])
except BaseException:
    _send({"ready": False, "kind": "import", "error": _tb()})
    sys.exit(0)
missing = [n for n in cfg["required"] if not callable(getattr(mod, n, None))]
if missing:
    _send({"ready": False, "kind": "missing",
           "error": "module %r does not define the callable(s) %s" % (cfg["module"], ", ".join(missing))})
    sys.exit(0)
if "torch" in sys.modules:
    try:
        sys.modules["torch"].manual_seed(cfg["seed"])
    except Exception:
        pass
_send({"ready": True})

while True:
    line = _pin.readline()
    if not line:
        break
    req = json.loads(line)
    op = req.get("op")
    if op == "exit":
        break
    fn = getattr(mod, req["fn"], None)
    if not callable(fn):
        _send({"ok": False, "kind": "missing",
               "error": "%s is not a callable of module %s" % (req["fn"], cfg["module"])})
        continue
    if op == "call":
        try:
            res = fn(*req["args"])
        except BaseException:
            _send({"ok": False, "kind": "exception", "etype": type(sys.exc_info()[1]).__name__, "error": _tb()})
            continue
        _send({"ok": True, "result": res})
    elif op == "batch":
        out = []
        failed = False
        for i, args in enumerate(req["args_list"]):
            try:
                out.append(fn(*args))
            except BaseException:
                _send({"ok": False, "kind": "exception", "index": i,
                       "etype": type(sys.exc_info()[1]).__name__, "error": _tb()})
                failed = True
                break
        if not failed:
            _send({"ok": True, "results": out})
'''


class _TailBuffer:
    """Collects the last ``limit`` bytes written to a pipe, from a daemon thread."""

    def __init__(self, fileobj, limit: int = 6000):
        self._buf = bytearray()
        self._limit = limit
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(fileobj,), daemon=True)
        self._thread.start()

    def _pump(self, fileobj):
        try:
            while True:
                chunk = fileobj.read1(65536) if hasattr(fileobj, "read1") else fileobj.read(65536)
                if not chunk:
                    break
                with self._lock:
                    self._buf += chunk
                    if len(self._buf) > 4 * self._limit:
                        del self._buf[:-self._limit]
        except (OSError, ValueError):
            pass

    def text(self, wait: float = 0.2) -> str:
        self._thread.join(wait)
        with self._lock:
            data = bytes(self._buf[-self._limit:])
        return data.decode("utf-8", errors="replace")


def kill_agent_processes() -> None:
    """SIGKILL every process of the agent's uid, however it detached (setsid, double fork): one kill(-1) from a
    child at that uid signals them all at once. Only as root (else the code under test is us)."""
    if os.getuid() != 0:
        return
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(AGENT_GID, AGENT_GID, AGENT_GID)
            os.setresuid(AGENT_UID, AGENT_UID, AGENT_UID)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


class UntrustedModule:
    """Import ``module`` from a copy of the submission in an unprivileged subprocess and call it.

    Usage::

        with UntrustedModule("strategy", paths.submission, required=["row_strategy"],
                             call_timeout=2.0, total_timeout=90.0) as m:
            move = m.call("row_strategy", history)
            moves = m.call_batch("row_strategy", [[h] for h in histories])

    * The submission directory is copied (symlinks and special files skipped) to a private temp dir
      which becomes the child's cwd and first sys.path entry; the child runs as the agent's uid/gid (AGENT_UID) with no
      supplementary groups when the evaluator is root, else as the current user.
    * The child's environment is minimal (no AIR_* variables), PYTHONHASHSEED=0, one BLAS thread;
      ``random`` and ``numpy.random`` (and torch, if the module imported it) are seeded with ``seed``.
    * Arguments and results travel as JSON (tuples become lists; numpy values are converted).
    * ``call_timeout`` applies to one call (a batch of n calls gets ``n * call_timeout``, at least
      ``call_timeout``, unless ``timeout=`` is given), ``import_timeout`` to the import, and
      ``total_timeout`` to the whole life of the session. Any limit hit kills the child's process
      group and raises UntrustedTimeout; later calls raise too.
    """

    def __init__(self, module: str, submission_dir: str, required: Iterable[str] = (),
                 call_timeout: float = 5.0, import_timeout: float = 60.0, total_timeout: float = 600.0,
                 seed: int = 0, max_message_bytes: int = 64 * 2**20, memory_mb: int | None = None,
                 max_file_bytes: int = 1 << 30, max_procs: int | None = 512,
                 max_submission_bytes: int = 1 << 30, python: str | None = None):
        self.module = module
        # Once the child has been called it has seen the evaluation's inputs, which may be hidden: from then on
        # nothing it produced (stderr, exception text, exit codes) is shown, only fixed words.
        self._hide_details = False
        self.call_timeout = float(call_timeout)
        self.total_timeout = float(total_timeout)
        self.max_message_bytes = int(max_message_bytes)
        self._t0 = time.monotonic()
        self._dead: UntrustedCodeError | None = None
        self._proc: subprocess.Popen | None = None
        self._rbuf = bytearray()
        self._workdir = stage_submission(submission_dir, max_total_bytes=max_submission_bytes,
                                         give_to_agent=False)
        try:
            self._start(module, required, import_timeout, seed, memory_mb, max_file_bytes, max_procs, python)
        except BaseException:
            self._kill()
            self._cleanup_dir()
            raise

    def _start(self, module, required, import_timeout, seed, memory_mb, max_file_bytes, max_procs, python):
        top = module.split(".")[0]
        if not (os.path.isfile(os.path.join(self._workdir, top + ".py"))
                or os.path.isfile(os.path.join(self._workdir, top, "__init__.py"))):
            raise SubmissionError(
                f"the submission has no {top}.py (or {top}/__init__.py); note that symbolic links are not followed")
        give_tree_to_agent(self._workdir)
        tmp = self._workdir  # the child's own directory doubles as HOME and TMPDIR
        py = python or sys.executable
        cfg = {"module": module, "workdir": self._workdir, "required": list(required), "seed": int(seed),
               "max_file_bytes": int(max_file_bytes), "max_procs": max_procs,
               "memory_bytes": int(memory_mb) * 2**20 if memory_mb else None}
        env = {
            "PATH": os.pathsep.join([os.path.dirname(py), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": self._workdir, "TMPDIR": tmp, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1", "MPLCONFIGDIR": tmp,
        }
        kwargs: dict[str, Any] = {}
        if os.getuid() == 0:
            kwargs.update(user=AGENT_UID, group=AGENT_GID, extra_groups=[])
        try:
            self._proc = subprocess.Popen(
                [py, "-s", "-B", "-c", _BOOTSTRAP, json.dumps(cfg)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd="/", env=env, close_fds=True, start_new_session=True, **kwargs)
        except OSError as exc:
            raise KitError(f"cannot start the sandboxed interpreter {py}: {exc}") from None
        self._stderr = _TailBuffer(self._proc.stderr)
        os.set_blocking(self._proc.stdout.fileno(), False)
        os.set_blocking(self._proc.stdin.fileno(), False)
        self._budget = float(import_timeout)
        msg = self._receive(min(float(import_timeout), self._remaining()), what=f"the import of {module}")
        if not isinstance(msg, dict) or "ready" not in msg:
            self._kill()
            raise self._mark(UntrustedProtocolError(f"unexpected first message from the {module} process",
                                                    self._tail()))
        if not msg["ready"]:
            kind = msg.get("kind")
            err = str(msg.get("error", ""))
            self._kill()
            if kind == "import":
                raise self._mark(UntrustedCrash(f"importing {module} failed:\n{err}", self._tail()))
            raise self._mark(UntrustedCrash(err, self._tail()))

    # -- public API -------------------------------------------------------------------------
    def call(self, fn: str, *args: Any, timeout: float | None = None) -> Any:
        """Call ``module.fn(*args)`` in the child and return its (JSON-decoded) result."""
        msg = self._request({"op": "call", "fn": fn, "args": list(args)},
                            self.call_timeout if timeout is None else timeout, fn)
        if "result" not in msg:
            raise self._fatal(UntrustedProtocolError(f"malformed reply to {fn}()", self._tail()))
        return msg["result"]

    def call_batch(self, fn: str, args_list: Sequence[Sequence[Any]], timeout: float | None = None) -> list:
        """Call ``module.fn(*args)`` for every ``args`` in ``args_list`` in one round trip."""
        args_list = [list(a) for a in args_list]
        if not args_list:
            return []
        if timeout is None:
            timeout = max(self.call_timeout, self.call_timeout * len(args_list))
        msg = self._request({"op": "batch", "fn": fn, "args_list": args_list}, timeout, fn)
        res = msg.get("results")
        if not isinstance(res, list) or len(res) != len(args_list):
            raise self._fatal(UntrustedProtocolError(f"malformed batch reply to {fn}()", self._tail()))
        return res

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None and self._dead is None:
            try:
                self._write(b'{"op":"exit"}\n', time.monotonic() + 1.0)
                self._proc.wait(1.0)
            except Exception:  # noqa: BLE001
                pass
        self._kill()
        self._cleanup_dir()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # -- internals --------------------------------------------------------------------------
    def _remaining(self) -> float:
        return self.total_timeout - (time.monotonic() - self._t0)

    def _tail(self) -> str:
        if self._hide_details or not hasattr(self, "_stderr"):
            return ""
        return self._stderr.text()

    def _mark(self, err: UntrustedCodeError) -> UntrustedCodeError:
        self._dead = err
        return err

    def _fatal(self, err: UntrustedCodeError) -> UntrustedCodeError:
        self._kill()
        return self._mark(err)

    def _kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        try:  # the whole process group, also when the child itself already exited
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        kill_agent_processes()  # and whatever it left in other sessions (a setsid daemon)
        if proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for f in (proc.stdin, proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def _cleanup_dir(self) -> None:
        d = getattr(self, "_workdir", None)
        if not d:
            return
        shutil.rmtree(d, ignore_errors=True)
        if os.path.lexists(d) and os.getuid() == 0:
            # root without CAP_DAC_OVERRIDE cannot enter the agent-owned tree: let the agent user remove it
            try:
                subprocess.run(["rm", "-rf", "--", d], user=AGENT_UID, group=AGENT_GID, extra_groups=[],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=60, cwd="/")
            except (OSError, subprocess.SubprocessError):
                pass
        self._workdir = None

    def _request(self, obj: dict, timeout: float, fn: str) -> dict:
        if self._dead is not None:
            raise self._dead
        self._hide_details = True
        try:
            data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"
        except (TypeError, ValueError) as exc:
            raise KitError(f"evaluation passed non-JSON arguments to {fn}: {exc}") from None
        budget = min(float(timeout), self._remaining())
        self._budget = float(timeout)
        deadline = time.monotonic() + max(budget, 0.0)
        what = f"{self.module}.{fn}()"
        self._write(data, deadline, what)
        msg = self._receive(deadline - time.monotonic(), what)
        if not isinstance(msg, dict) or "ok" not in msg:
            raise self._fatal(UntrustedProtocolError(f"malformed reply from {what}", self._tail()))
        if not msg["ok"]:
            err = str(msg.get("error", "unknown error"))
            kind = msg.get("kind")
            if kind == "protocol":
                raise self._fatal(UntrustedProtocolError(f"{what}: {err}", self._tail()))
            etype = str(msg.get("etype", ""))
            builtin = getattr(builtins, etype, None)
            if not (isinstance(builtin, type) and issubclass(builtin, BaseException)):
                etype = "an exception"  # only builtin names: a custom name could carry data
            raise self._fatal(UntrustedCrash(
                f"{what} raised {etype}. The traceback and output are not shown because the evaluation's "
                f"inputs are hidden; reproduce it locally."))
        return msg

    def _timeout_error(self, what: str) -> UntrustedTimeout:
        if self._remaining() <= 0:
            text = (f"{what} did not finish: the total time limit of {self.total_timeout:.0f}s for running your "
                    "code was exceeded")
        else:
            limit = getattr(self, "_budget", None)
            text = f"{what} did not finish within its time limit" + (f" of {limit:g}s" if limit else "")
        self._kill()
        return self._mark(UntrustedTimeout(text, self._tail()))

    def _write(self, data: bytes, deadline: float, what: str = "the child") -> None:
        fd = self._proc.stdin.fileno()
        view = memoryview(data)
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_WRITE)
        try:
            while view:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timeout_error(what)
                if not sel.select(left):
                    continue
                try:
                    n = os.write(fd, view)
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    raise self._fatal(UntrustedCrash(f"the process running your code exited unexpectedly while "
                                                     f"{what} was being called", self._tail())) from None
                view = view[n:]
        finally:
            sel.close()

    def _receive(self, timeout: float, what: str) -> Any:
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + max(timeout, 0.0)
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        try:
            while True:
                nl = self._rbuf.find(b"\n")
                if nl >= 0:
                    line = bytes(self._rbuf[:nl])
                    del self._rbuf[:nl + 1]
                    try:
                        return json.loads(line)
                    except (ValueError, UnicodeDecodeError):
                        raise self._fatal(UntrustedProtocolError(
                            f"garbled protocol output while running {what}", self._tail())) from None
                if len(self._rbuf) > self.max_message_bytes:
                    raise self._fatal(UntrustedProtocolError(
                        f"the reply of {what} is larger than {self.max_message_bytes} bytes", self._tail()))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timeout_error(what)
                if not sel.select(min(left, 1.0)):
                    continue
                try:
                    chunk = os.read(fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    code = self._proc.wait(5) if self._proc.poll() is None else self._proc.returncode
                    if self._hide_details:  # an exit code is the code's choice: 8 bits of hidden inputs
                        desc = "it was killed (out of memory?)" if code == -signal.SIGKILL else "it exited"
                    else:
                        desc = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                    raise self._fatal(UntrustedCrash(
                        f"the process running your code died ({desc}) while running {what}", self._tail()))
                self._rbuf += chunk
        finally:
            sel.close()
