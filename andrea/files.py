"""Files written whole or not at all, JSON read with one wording of its errors, folders proven
writable before work starts.

Every file andrea writes that a later run reads (checkpoints, token shards, the manifest,
tokenizers, exports) goes through `atomic_output`: the data is written to a temporary file in
the same folder under a name no other process uses, flushed and fsynced, renamed over the
target, and then the folder is fsynced. The finished file gets the mode a newly created file
gets under the process's umask (0644 under the usual 022), whatever the writer chose for its
temporary file (safetensors writes 0600). A crash leaves the old file or the new one, never half,
and two processes never share a temporary file. A write the system refuses (a full disk, a
read-only filesystem, no permission) removes the temporary file and ends in one AndreaError that
names the target, which is left as it was.

`FolderLock` keeps two processes from working in one folder at once (two training runs in one
run folder): an exclusive `flock` on a file in the folder, held while the process lives, so a
killed process never leaves a stale lock behind. A process killed while it writes (SIGKILL, a
power cut) leaves its temporary file; `remove_dead_temps`, called by whoever holds the folder's
lock, removes those whose process is no longer alive.

Everything andrea reads from a path it is given must be a regular file (`check_regular`): a FIFO
would block the reader forever and a device such as /dev/zero never ends, so both are refused
with one sentence before they are opened.

An `.npz` andrea wrote and reads back (`read_npz`) is believed only member by member: each
member's `.npy` header is read first and its dtype, shape and byte count compared with what the
reader expects, the sum bounded, before any data is decompressed; then exactly that many bytes
are read. A file whose headers claim 10^11 values, or whose few megabytes inflate to gigabytes,
costs nothing before it is refused.

`FolderLock` never writes through a link: a `.lock` that is a symbolic link, a hard link to
another file or no regular file at all is refused, so no file outside it is ever written.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import stat
import zipfile
from contextlib import contextmanager
from pathlib import Path

from andrea.errors import AndreaError

TMP_MARK = ".tmp-"  # temporary files are NAME.tmp-<pid>-<random>


def temp_name(path: Path) -> Path:
    """A temporary file name next to path that no other process or call will pick."""
    return path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_output(path):
    """Yield a temporary path to write; on success it replaces `path` durably, on any error it
    is removed and `path` is left as it was.

        with atomic_output(target) as tmp:
            save_file(tensors, str(tmp))
    """
    path = Path(path)
    tmp = temp_name(path)
    try:
        yield tmp
        replace_durably(tmp, path)
        remove_dead_temps_of(path)
    except BaseException as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(e, OSError) or _is_write_error(e):
            raise AndreaError(f"could not write {path} ({write_error_reason(e)}); "
                              f"{'it is as it was' if path.exists() else 'nothing was written'}.") from None
        raise


def _umask() -> int:
    """The process's umask: from /proc/self/status where there is one (reading it so changes
    nothing), else by setting it and setting it back."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def replace_durably(tmp: Path, path: Path) -> None:
    """Make the finished file tmp durable with a new file's usual mode, rename it over path, and
    make the rename durable."""
    with open(tmp, "rb+") as f:
        os.fchmod(f.fileno(), 0o666 & ~_umask())
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def _is_write_error(e: BaseException) -> bool:
    """A writer's own wrapping of a system error (safetensors reports them as SafetensorError
    with "(os error N)" in its message)."""
    return _os_errno(e) is not None


def _os_errno(e: BaseException) -> int | None:
    found = re.search(r"\(os error (\d+)\)", str(e))
    return int(found.group(1)) if found else None


def write_error_reason(e: BaseException) -> str:
    """What the system said, in a few words: "No space left on device", "Read-only file system"."""
    if isinstance(e, OSError):
        if e.strerror:
            return e.strerror
        if e.errno:
            return os.strerror(e.errno)
    code = _os_errno(e)
    if code is not None:
        return os.strerror(code)
    return str(e).splitlines()[0][:120] if str(e) else type(e).__name__


def atomic_write_bytes(path, data: bytes) -> None:
    """Write data to path so that a crash leaves the old file or the new one, never half."""
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def check_writable(folder, what: str = "the folder") -> None:
    """Make folder if needed and prove a file can be written there, before any work is done."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = temp_name(folder / ".write-test")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise AndreaError(f"cannot write to {what} {folder} ({e.strerror}).") from None


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def check_regular(path, what: str = "file") -> Path:
    """path, once it is known to name a regular file (through any symlinks); else an AndreaError.

    A FIFO, a device or a socket is refused by its kind before anything opens it: opening a FIFO
    blocks until something writes to it, and a device like /dev/zero is read without end."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise AndreaError(f"{what} {path} does not exist.") from None
    except OSError as e:
        raise AndreaError(f"{what} {path} cannot be read ({write_error_reason(e)}).") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise AndreaError(f"{what} {path} is {kind}, not a regular file; andrea reads only regular files "
                          f"(copy the data into a file first).")
    return path


def open_regular(path, mode: str = "rb", what: str = "file"):
    """path opened in `mode` ("rb" or "a"), once the opened file is known to be a regular one; else
    an AndreaError. Opened without blocking first, so a FIFO in its place (which blocks an open
    until the other end opens) is refused instead of waited on; a missing file raises
    FileNotFoundError as open does (in "a", it is created)."""
    flags = {"rb": os.O_RDONLY, "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT}[mode]
    try:
        fd = os.open(path, flags | os.O_NONBLOCK, 0o666)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise AndreaError(f"{what} {path} is a FIFO, not a regular file; andrea reads and writes only regular "
                              f"files.") from None
        raise
    try:
        st_mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(st_mode):
            kind = next((name for test, name in _KINDS if test(st_mode)), "not a regular file")
            raise AndreaError(f"{what} {path} is {kind}, not a regular file; andrea reads and writes only regular files.")
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def remove_dead_temps_of(path) -> list[Path]:
    """Remove the temporary files of this one file (NAME.tmp-PID-HEX beside it) whose process is no
    longer alive: a write killed before its rename leaves one, and the next write of the same file
    takes it away (`atomic_output` calls this after each write). No lock is needed: a process that
    is gone writes nothing, and a live one's file (its id reused, too) is never touched."""
    path = Path(path)
    prefix = path.name + TMP_MARK
    try:
        with os.scandir(path.parent) as entries:
            names = [e.name for e in entries if e.name.startswith(prefix)]
    except OSError:
        return []
    return _remove_dead(path.parent, names)


def remove_dead_temps(folder) -> list[Path]:
    """Remove the temporary files (NAME.tmp-PID-HEX) in folder whose process is no longer alive,
    as a killed write leaves them; return them. Call it only while holding the folder's lock:
    a live process's temporary file, this one's included, is never touched."""
    try:
        names = [p.name for p in Path(folder).iterdir()]
    except OSError:
        return []
    return _remove_dead(Path(folder), names)


def _remove_dead(folder: Path, names) -> list[Path]:
    """Of the files `names` in folder, remove the temporary ones whose process is gone; return them."""
    removed = []
    for name in names:
        found = _TEMP_RE.fullmatch(name)
        if found is None or _alive(int(found.group(1))):
            continue
        p = folder / name
        try:
            if p.is_file() and not p.is_symlink():
                p.unlink()
                removed.append(p)
        except OSError:
            pass  # left for the next write or run to try again
    return removed


_TEMP_RE = re.compile(r".+" + re.escape(TMP_MARK) + r"(\d+)-[0-9a-f]{8}")


def _alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user's counts as alive)."""
    if pid == os.getpid() or pid <= 0:
        return True  # this process, or no process id a temporary name gets: the file stays
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # it exists but is not ours (EPERM), or the number is no process id
    return True


MAX_JSON_DEPTH = 100  # nesting andrea reads: its own files nest a few levels; deeper is refused, not recursed into
_ESCAPE = re.compile(rb"\\.", re.S)
_IDENTITY = bytes(range(256))
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_STRING = re.compile(rb'"[^"]*"')
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)
_LONG_DIGITS = re.compile(rb"\d{4301,}")


class _TooDeep(Exception):
    pass


def parse_json(data, where: str, line: int | None = None):
    """The JSON value of `data` (bytes or str), or one AndreaError that names `where` (a file, a
    request body) and the line: the one reading path for every JSON andrea takes in.

    Python's own limits end in the same sentence as a syntax error: nesting deeper than
    MAX_JSON_DEPTH (checked before parsing, so a value nested 990 deep never reaches code that
    recurses over it) and integers of more than 4,300 digits. `line` is the line of a JSONL file
    `data` came from (its own line numbers are then left out)."""
    at = f"{where} line {line:,}" if line else where
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    try:
        _check_depth(raw)
        # bytes are UTF-8 (RFC 8259), decoded strictly: json.loads would guess UTF-16 or UTF-32 from them
        return json.loads(raw.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data)
    except UnicodeDecodeError:
        raise AndreaError(f"{at} is not UTF-8 text, so not JSON.") from None
    except json.JSONDecodeError as e:
        inner = "" if line else f" at line {e.lineno:,}"
        raise AndreaError(f"{at} is not valid JSON ({e.msg}{inner}).") from None
    except (_TooDeep, RecursionError):
        inner = "" if line else f" at line {_deep_line(raw):,}"
        raise AndreaError(f"{at} nests its JSON more than {MAX_JSON_DEPTH} levels deep{inner}; "
                          f"andrea reads no JSON nested that deep.") from None
    except ValueError:  # int(): Python reads integers of at most 4,300 digits
        found = _LONG_DIGITS.search(raw)
        inner = "" if line or found is None else f" at line {_line_at(raw, found.start()):,}"
        raise AndreaError(f"{at} holds a number of more than 4,300 digits{inner}, which is no number andrea "
                          f"reads.") from None


def _check_depth(raw: bytes) -> None:
    """Raise _TooDeep when raw nests arrays and objects deeper than MAX_JSON_DEPTH. The brackets
    are found in C (escapes and strings dropped); only they are walked in Python."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return
    marks = _ESCAPE.sub(b"", raw).translate(_IDENTITY, _NOT_STRUCTURE)  # brackets and the quotes of strings
    depth = 0
    for c in _STRING.sub(b"", marks):
        depth += 1 if c in b"[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise _TooDeep


def _deep_line(raw: bytes) -> int:
    """The line where raw first nests deeper than MAX_JSON_DEPTH (for the error only)."""
    depth = 0
    for m in _TOKEN.finditer(raw):
        c = m.group()
        if c in (b"[", b"{"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return _line_at(raw, m.start())
        elif c in (b"]", b"}"):
            depth -= 1
    return 1


def _line_at(raw: bytes, offset: int) -> int:
    return raw.count(b"\n", 0, offset) + 1


def utf8_text(data: bytes, what: str, advice: str = "andrea reads text as UTF-8") -> str:
    """Bytes as text: UTF-8, or one sentence naming `what`, the first bad byte and its offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AndreaError(f"{what} is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start:,}); {advice}.") from None


MAX_JSON_LINE = 1 << 20  # one row of andrea's JSON Lines files (metrics.jsonl): a few KB at most


def json_lines(f, where: str, cap: int = MAX_JSON_LINE):
    """The value (or None) of each line of a binary file of JSON Lines; a line that is
    not JSON, or longer than `cap` bytes, gives None. No more than `cap` bytes of a line are ever
    held: the rest of a longer one is skipped in pieces, so a one-line 7 GB file costs nothing."""
    number = 0
    while True:
        line = f.readline(cap + 2)
        if not line:
            return
        number += 1
        if len(line.rstrip(b"\n")) > cap:  # too long: skip to the end of this line without keeping it
            while line and not line.endswith(b"\n"):
                line = f.readline(cap)
            yield None
            continue
        try:
            yield parse_json(line, where, number)
        except AndreaError:
            yield None


MAX_JSON_BYTES = 64 << 20  # andrea's own JSON files: the largest, a tokenizer's, is well under 1 MB


# The files andrea writes and reads again whose shape is declared beside their reader (read_json's
# `shape`); tests/test_files.py drives each reader through the same damaged values. The other JSON
# files have a checking reader of their own, named in docs/guarantees.md.
SHAPED_FILES = (
    "processor.json (andrea.processor)", "verified.json (andrea.shards)", "prepare-progress.json (andrea.prepare)",
    "train.json (andrea.usage.run_data)",
)


def read_json(path, what: str = "file", limit: int = MAX_JSON_BYTES, shape=None):
    """The JSON value in a file, or an AndreaError that names `what`, the path and the problem. A
    file over `limit` bytes is refused by its size (fstat, before a byte is read), so a huge or
    sparse file costs no memory. With `shape` (an `andrea.validate.Shape`, declared beside the
    reader), the value must have it: every field of its type, in its range and finite."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        check_regular(path, what)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise AndreaError(f"{what} {path} holds {size:,} bytes, more than the {limit:,} andrea reads as one "
                                  f"JSON file; it is not a file andrea wrote.")
            data = f.read(limit + 1)
        if len(data) > limit:  # it grew while being read
            raise AndreaError(f"{what} {path} holds more than the {limit:,} bytes andrea reads as one JSON file.")
    except FileNotFoundError:
        raise AndreaError(f"{what} {path} does not exist.") from None
    except IsADirectoryError:
        raise AndreaError(f"{what} {path} is a folder, not a JSON file.") from None
    except PermissionError:
        raise AndreaError(f"{what} {path} cannot be read (permission denied).") from None
    except OSError as e:
        raise AndreaError(f"{what} {path} cannot be read ({e.strerror}).") from None
    value = parse_json(data, f"{what} {path}")
    if shape is not None:
        from andrea.validate import check_shape

        check_shape(value, shape, f"{what} {path}")
    return value


class FolderLock:
    """An exclusive lock on `folder` for as long as this object (or the process) lives.

    The lock is an `flock` on `folder/.lock`, which also holds the owner's process id so that a
    second process can say who holds it. The kernel drops the lock when the process ends however
    it ends (a crash, SIGKILL), so a lock left by a dead process is no lock at all.
    """

    NAME = ".lock"
    fd = None

    def __init__(self, folder, what: str = "the folder", hint: str = ""):
        self.path = Path(folder) / self.NAME
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise AndreaError(f"cannot lock {what} {folder}: its {self.NAME} is a symbolic link, which andrea "
                                  f"never writes through; remove it.") from None
            raise AndreaError(f"cannot lock {what} {folder} ({write_error_reason(e)}).") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:  # a FIFO, a device, a hard link to another file
            os.close(fd)
            raise AndreaError(f"cannot lock {what} {folder}: its {self.NAME} is not a regular file of its own; "
                              f"remove it.")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            owner = _read_owner(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise AndreaError(f"cannot lock {what} {folder} ({write_error_reason(e)}).") from None
            who = f"process {owner}" if owner else "another process"
            raise AndreaError(f"{what} {folder} is in use by {who}, which is running there now{hint}.") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass  # the lock holds without the note of who holds it
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        self.release()


def _read_owner(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


NPZ_LIMIT = 1 << 31  # bytes of arrays one .npz read may hold in all


def read_npz(path, members: dict, what: str = "file", limit: int = NPZ_LIMIT) -> dict:
    """The arrays of an .npz file, each checked before its data is read; else an AndreaError.

    `members` maps each name to (dtype, shape): dtype a numpy dtype name ("int64") or "str" (a
    unicode string array of at most 256 characters an item), shape a tuple of ints. A member
    missing, of another dtype or shape, stored in Fortran order or holding objects is refused from
    its header, as is a file whose members come to more than `limit` bytes; the data read is
    exactly what the header declares, so a member that inflates to more is never inflated."""
    path = check_regular(path, what)
    try:
        with zipfile.ZipFile(path) as z:
            plan = [(name, _npz_header(z, name, spec, path, what)) for name, spec in members.items()]
            if sum(header[2] for _, header in plan) > limit:
                raise AndreaError(f"{what} {path} holds more than {limit:,} bytes of arrays, more than it can.")
            return {name: _npz_data(z, name, header, path, what) for name, header in plan}
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, RuntimeError, NotImplementedError) as e:
        raise AndreaError(f"{what} {path} is not a readable .npz file ({str(e)[:80] or type(e).__name__}).") from None


def _npz_header(z, name: str, spec, path, what):
    """(dtype, shape, bytes) of member `name` from its .npy header, once they are what `spec` says."""
    import numpy as np

    want_dtype, want_shape = spec
    try:
        f = z.open(f"{name}.npy")
    except KeyError:
        raise AndreaError(f"{what} {path} has no array '{name}'.") from None
    with f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise AndreaError(f"{what} {path}: array '{name}' is in .npy format {version}, which andrea does not read.")
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        start = f.tell()
    ok_dtype = (dtype.kind == "U" and dtype.itemsize <= 4 * 256) if want_dtype == "str" else dtype == np.dtype(want_dtype)
    if fortran or dtype.hasobject or not ok_dtype or tuple(shape) != tuple(want_shape):
        raise AndreaError(f"{what} {path}: array '{name}' is {dtype} of shape {tuple(shape)}, not "
                          f"{want_dtype} of shape {tuple(want_shape)}.")
    nbytes = dtype.itemsize * int(np.prod(shape, dtype=object))
    return dtype, tuple(shape), nbytes, start


def _npz_data(z, name: str, header, path, what):
    import numpy as np

    dtype, shape, nbytes, start = header
    with z.open(f"{name}.npy") as f:
        f.read(start)
        data = f.read(nbytes)
    if len(data) != nbytes:
        raise AndreaError(f"{what} {path}: array '{name}' is cut short.")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
