"""Atomic writes: nothing half-written is ever left where the user looks, and nothing is overwritten unasked.

Every output (WAVs, reports, model folders, exports; the torch-free runtime's too) goes to a temporary name in the
destination's own folder, then is renamed into place. Temporary names are short and carry the writer's pid
(`.ttsq-PID-XXXXXXXX.tmp`), so a 255-byte file name still fits, and what a killed run left behind is recognised
and removed by the next run. Only regular files and ttsq folders are ever replaced: never a link (followed or
not), a device node, a pipe or a user's folder. New files and folders get the modes the umask allows, and a file
replaced with --force keeps its mode. This module imports only the standard library."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
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
TEMP_PREFIX = ".ttsq-"
# ours: .ttsq-PID-RANDOM.tmp / .old beside outputs, ttsq-TAG-PID-RANDOM in the temp folder
OURS = re.compile(r"^\.?ttsq-(?:[a-z]+-)?(\d+)-\w+(?:\.tmp|\.old)?$")
NEARLY_FULL = 1 << 20  # bytes free below which a failed write is put down to the full disk
LEGACY_AGE_S = 3600  # a legacy temp folder untouched this long belongs to no live run


def umask() -> int:
    """The process umask, read without changing it where /proc tells it (os.umask's read-by-set races threads)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    old = os.umask(0o022)
    os.umask(old)
    return old


def default_mode(folder: bool = False) -> int:
    """The mode open()/mkdir() would give a new file or folder under the user's umask (mkstemp and mkdtemp create
    0600/0700, which the user would otherwise get once the temporary is renamed into place)."""
    return (0o777 if folder else 0o666) & ~umask()


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's live process (or an unreadable answer): keep its files
    return True


def _newest_mtime(p: Path) -> float:
    times = [p.lstat().st_mtime]
    if p.is_dir() and not p.is_symlink():
        times += [f.lstat().st_mtime for f in p.rglob("*")]
    return max(times)


def clean_stale(folder: Path, legacy: re.Pattern | None = None) -> list[Path]:
    """Remove what killed ttsq runs left in `folder`: temporary files and folders of pids no longer alive, and
    folders named by `legacy` (what ttsq wrote before names carried pids) untouched for an hour. A live process's
    work is never touched. -> what was removed."""
    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    now = time.time()
    for p in entries:
        m = OURS.match(p.name)
        try:
            if m:
                if _pid_alive(int(m.group(1))):
                    continue
            elif not (
                legacy
                and legacy.match(p.name)
                and p.is_dir()
                and not p.is_symlink()
                and now - _newest_mtime(p) >= LEGACY_AGE_S
            ):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
        except OSError:
            continue  # gone meanwhile, or not ours to remove: leave it
    return removed


def temp_name() -> tuple[str, str]:
    """(prefix, suffix) of a short temporary name carrying this pid, for mkstemp/mkdtemp beside an output."""
    return f"{TEMP_PREFIX}{os.getpid()}-", ".tmp"


def disk_full_error(e: BaseException, out: Path) -> OSError | None:
    """The error to raise instead of `e` when `e` says the disk filled up while writing `out` (an OSError with
    ENOSPC, or a library's wrapped 'No space left on device'); None for any other error."""
    text = str(e)
    path = Path(getattr(e, "filename", None) or out)  # the scratch folder's disk may be the full one
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    said = (
        (isinstance(e, OSError) and e.errno == errno.ENOSPC)
        or "No space left on device" in text
        or "os error 28" in text
    )
    # libsndfile says only "System error.": a write error while the disk has (almost) nothing left is the full disk
    if not said and not (isinstance(e, (OSError, RuntimeError)) and free is not None and free < NEARLY_FULL):
        return None
    free = "" if free is None else f" ({free / 2**20:.1f} MiB free there)"
    return OSError(
        errno.ENOSPC,
        f"No space left on device (ENOSPC) to write {path}: the disk is full{free}; "
        f"nothing was replaced at {out}. Free some space, or write somewhere else",
    )


def member(root: str | Path, name, manifest: str = "manifest") -> Path:
    """The file `name` that a model folder's manifest lists, confined to the folder: a relative path with no `..`
    that resolves inside `root` and, if it exists, is a regular file (never a device, pipe or /proc file, whose
    reading can hang). A manifest naming anything else is refused: its stat or hash would leak outside files."""
    root = Path(root)
    where = f"{root / manifest} names {name!r}"
    if not isinstance(name, str) or not name or "\0" in name:
        raise ValueError(f"{where}: a file name must be a non-empty string")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts or "\\" in name:
        raise ValueError(
            f"{where}: only paths inside the model folder are allowed (no absolute paths, no `..`); "
            "the manifest was edited or is hostile: re-create the model folder"
        )
    path = root / rel
    real, inside = path.resolve(), root.resolve()
    if real != inside and inside not in real.parents:
        raise ValueError(
            f"{where}, which resolves to {real}, outside the model folder; re-create the folder "
            "with its files inside it"
        )
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return path  # the caller names a missing file itself
    except OSError as e:
        raise ValueError(f"{where}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{where}, which is not a regular file (a folder, device or pipe); re-create the model folder")
    return path


def check_replaceable(out: Path) -> None:
    """--force replaces a ttsq folder only: never a user's folder, a file, or a link."""
    if out.is_symlink() or not out.is_dir() or not any((out / m).is_file() for m in MANIFESTS):
        raise OutputExistsError(
            f"{out} exists and is not a ttsq model, artifact or export folder (no "
            f"{' or '.join(MANIFESTS)}): --force replaces only those. Choose another --out, or "
            "move it away yourself"
        )


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def check_output_file(path: str | Path, *, force: bool = False) -> Path:
    """What writing `path` with atomic_file would refuse, checked up front (before a slow synthesis): it must be a
    new name or, with force, a regular file; never a link (even dangling), folder, device node, pipe or socket."""
    path = Path(path)
    limit = _name_max(path.parent if path.parent.is_dir() else Path("."))
    if len(os.fsencode(path.name)) > limit:
        raise OSError(
            errno.ENAMETOOLONG,
            f"the file name {path.name[:40]}... is {len(os.fsencode(path.name))} "
            f"bytes; its folder allows {limit}: choose a shorter name",
        )
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OSError(e.errno, f"cannot use {path}: {e.strerror}; choose another path") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            what = "a symbolic link" + ("" if path.exists() else " to nothing (dangling)")
            raise OutputExistsError(
                f"{path} is {what}; ttsq writes only regular files and never follows links, even "
                "with --force: give the link's target itself, or another name"
            )
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(f"{path} is a folder; give a file name, e.g. {path / 'out.wav'}")
        if not stat.S_ISREG(st.st_mode):
            raise OutputExistsError(
                f"{path} is not a regular file (a device, pipe or socket); ttsq replaces only "
                "regular files, even with --force: choose a file name"
            )
        if not force:
            raise OutputExistsError(f"{path} already exists; pass --force to overwrite it, or choose another path")
    parent = path.parent
    if not parent.is_dir():
        raise FileNotFoundError(f"folder {parent} does not exist; create it or choose another path")
    if not os.access(parent, os.W_OK):
        raise PermissionError(f"cannot write in {parent}: permission denied; choose a writable path")
    return path


@contextlib.contextmanager
def atomic_file(path: str | Path, *, force: bool = False):
    """Yield a temporary path in `path`'s folder to write; on success it becomes `path` by a rename (with force, over
    a regular file, whose mode it keeps; without, only if `path` is still free). On failure nothing changes."""
    path = check_output_file(path, force=force)
    parent = path.parent
    clean_stale(parent)
    prefix, suffix = temp_name()
    try:
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=parent)
    except OSError as e:
        raise OSError(e.errno, f"cannot write in {parent}: {e.strerror}; choose a writable path") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        try:
            old = os.lstat(path)
        except FileNotFoundError:
            old = None
        if old is not None:
            check_output_file(path, force=force)  # became a link or a device meanwhile: still refused
            os.chmod(tmp, stat.S_IMODE(old.st_mode))
            with contextlib.suppress(OSError):  # keep the owner too where allowed (root replacing a user's file)
                os.chown(tmp, old.st_uid, old.st_gid)
            os.replace(tmp, path)  # replaces the name itself: never writes through it
        else:
            os.chmod(tmp, default_mode())
            try:
                os.link(tmp, path)  # fails if the name appeared meanwhile: never clobbers another writer's file
            except FileExistsError:
                raise _raced(path) from None
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                    raise
                os.replace(tmp, path)  # a filesystem without hard links
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except BaseException as e:
        full = disk_full_error(e, path)  # while the temporary file still fills the disk
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if full is not None:
            raise full from e
        raise


def atomic_write_bytes(path: str | Path, data: bytes, *, force: bool = True) -> Path:
    path = Path(path)
    with atomic_file(path, force=force) as tmp:
        tmp.write_bytes(data)
    return path


def check_output_dir(out: str | Path, *, force: bool = False) -> Path:
    """What atomic_dir refuses, checked up front (before a slow quantization or export)."""
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not force:
        raise OutputExistsError(f"{out} already exists; pass --force to replace it, or choose another --out")
    if out.exists() or out.is_symlink():
        check_replaceable(out)
    return out


@contextlib.contextmanager
def atomic_dir(out: Path, *, force: bool = False):
    """Yield a temporary sibling folder; on success it replaces `out` (only with force, and only a ttsq folder,
    if `out` exists)."""
    out = check_output_dir(out, force=force)
    parent = out.parent if str(out.parent) else Path(".")
    prefix, suffix = temp_name()
    try:
        parent.mkdir(parents=True, exist_ok=True)
        clean_stale(parent, re.compile(rf"^\.{re.escape(out.name)}\.(?:tmp|old)-\w{{8}}$"))
        tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
        os.chmod(tmp, default_mode(folder=True))
    except OSError as e:
        raise PermissionError(f"cannot write to {parent}: {e.strerror}. Choose a writable --out") from e
    try:
        yield tmp
        with _commit_lock(out):
            if out.exists() and not force:  # another writer finished first: keep theirs, report ours
                raise _raced(out)
            if out.exists():
                check_replaceable(out)
                old = Path(tempfile.mkdtemp(prefix=prefix, suffix=".old", dir=parent))
                os.replace(out, old / "previous")  # keep the previous copy until the new one is in place
                os.replace(tmp, out)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, out)
    except BaseException as e:
        full = disk_full_error(e, out)
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise full from e
        raise


@contextlib.contextmanager
def _commit_lock(out: Path):
    """Serialise the check-and-rename of concurrent writers; mkdir is atomic on every filesystem."""
    lock = out.parent / f"{TEMP_PREFIX}lock-{hashlib.sha256(os.fsencode(out.name)).hexdigest()[:16]}"
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


def work_dir(tag: str) -> tempfile.TemporaryDirectory:
    """A scratch folder in the system's temp folder (ttsq-TAG-PID-XXXX), removed on exit; what killed runs left
    there is removed first."""
    clean_stale(Path(tempfile.gettempdir()), re.compile(rf"^ttsq-{tag}-\w{{8}}$"))
    return tempfile.TemporaryDirectory(prefix=f"ttsq-{tag}-{os.getpid()}-")
