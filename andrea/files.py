"""Files written whole or not at all, JSON read with one wording of its errors, folders proven
writable before work starts.

Every file andrea writes that a later run reads (checkpoints, token shards, the manifest,
tokenizers, exports) goes through `atomic_output`: the data is written to a temporary file in
the same folder under a name no other process uses, flushed and fsynced, renamed over the
target, and then the folder is fsynced. A crash leaves the old file or the new one, never half,
and two processes never share a temporary file.
"""

from __future__ import annotations

import json
import os
import secrets
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
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def replace_durably(tmp: Path, path: Path) -> None:
    """Make the finished file tmp durable, rename it over path, and make the rename durable."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


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


def read_json(path, what: str = "file"):
    """The JSON value in a file, or an AndreaError that names `what`, the path and the problem."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise AndreaError(f"{what} {path} does not exist.") from None
    except IsADirectoryError:
        raise AndreaError(f"{what} {path} is a folder, not a JSON file.") from None
    except PermissionError:
        raise AndreaError(f"{what} {path} cannot be read (permission denied).") from None
    except OSError as e:
        raise AndreaError(f"{what} {path} cannot be read ({e.strerror}).") from None
    except UnicodeDecodeError:
        raise AndreaError(f"{what} {path} is not UTF-8 text, so not a JSON file.") from None
    except json.JSONDecodeError as e:
        raise AndreaError(f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno}).") from None
    except RecursionError:
        raise AndreaError(f"{what} {path} nests its JSON too deeply to read.") from None
