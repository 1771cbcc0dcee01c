"""Atomic writes: nothing half-written is ever left where the user looks, and nothing is overwritten unasked."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


class OutputExistsError(FileExistsError):
    pass


def _raced(out: Path) -> OutputExistsError:
    return OutputExistsError(
        f"{out} appeared while this one was being written (another writer?); "
        "nothing was replaced. Pass --force to replace it"
    )


#: what marks a folder as ttsq's own output, which --force may replace (models, quantized artifacts, ONNX exports)
MANIFESTS = ("manifest.json", "onnx_manifest.json")


def check_replaceable(out: Path) -> None:
    """--force replaces a ttsq folder only: never a user's folder, a file, or a link."""
    if out.is_symlink() or not out.is_dir() or not any((out / m).is_file() for m in MANIFESTS):
        raise OutputExistsError(
            f"{out} exists and is not a ttsq model, artifact or export folder (no "
            f"{' or '.join(MANIFESTS)}): --force replaces only those. Choose another --out, or "
            "move it away yourself"
        )


@contextlib.contextmanager
def atomic_dir(out: Path, *, force: bool = False):
    """Yield a temporary sibling folder; on success it replaces `out` (only with force, and only a ttsq folder,
    if `out` exists)."""
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not force:
        raise OutputExistsError(f"{out} already exists; pass --force to replace it, or choose another --out")
    if out.exists() or out.is_symlink():
        check_replaceable(out)
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
        tmp.chmod(default_mode(folder=True))
    except OSError as e:
        raise PermissionError(f"cannot write to {parent}: {e.strerror}. Choose a writable --out") from e
    try:
        yield tmp
        with _commit_lock(out):
            if out.exists() and not force:  # another writer finished first: keep theirs, report ours
                raise _raced(out)
            if out.exists():
                check_replaceable(out)
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
                os.replace(out, old / out.name)  # keep the previous copy until the new one is in place
                os.replace(tmp, out)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _commit_lock(out: Path):
    """Serialise the check-and-rename of concurrent writers; mkdir is atomic on every filesystem."""
    lock = out.parent / f".{out.name}.lock"
    try:
        os.mkdir(lock)
    except FileExistsError:
        raise OutputExistsError(
            f"another writer is saving {out} right now; nothing was replaced. "
            f"If no ttsq process is running, remove the stale {lock}"
        ) from None
    try:
        yield
    finally:
        os.rmdir(lock)


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def default_mode(folder: bool = False) -> int:
    """The mode open()/mkdir() would give a new file or folder under the user's umask. mkstemp and mkdtemp create
    0600/0700, which would otherwise be what the user gets once the temporary is renamed into place."""
    return (0o777 if folder else 0o666) & ~_umask()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), default_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
