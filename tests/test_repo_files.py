"""What the repository tracks: no large files outside the shipped assets. Weights, audio and archives belong in
toolkit/assets/ (shipped with the package) or, small, in tests/fixtures/; a run's outputs stay out of git."""

import fnmatch
import subprocess
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11 on

ROOT = Path(__file__).resolve().parents[1]
MB = 2**20
LIMITS = {"toolkit/assets/": None, "tests/fixtures/": 2 * MB}  # folder -> largest file allowed there (None: any)
LIMIT = 1 * MB  # anywhere else


def limit_for(path: str) -> int | None:
    return next((v for k, v in LIMITS.items() if path.startswith(k)), LIMIT)


def too_large(paths: list[str], root: Path = ROOT) -> list[str]:
    out = []
    for p in paths:
        f, cap = root / p, limit_for(p)
        if cap is not None and f.is_file() and not f.is_symlink() and f.stat().st_size > cap:
            out.append(f"{p}: {f.stat().st_size / MB:.1f} MB, over {cap / MB:.0f} MB")
    return out


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.decode().split("\0") if p]


def test_the_check_refuses_large_files_outside_the_assets(tmp_path):
    for p, size in {
        "docs/w.safetensors": LIMIT + 1,
        "toolkit/assets/voice/m.safetensors": 30 * MB,
        "tests/fixtures/a.bin": LIMIT + 1,
        "tests/fixtures/b.bin": 2 * MB + 1,
        "docs/ok.png": LIMIT,
    }.items():
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_bytes(b"\0" * size)
    found = too_large(sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()), tmp_path)
    assert [f.split(":")[0] for f in found] == ["docs/w.safetensors", "tests/fixtures/b.bin"]


def test_no_large_files_are_tracked_outside_the_shipped_assets():
    assert too_large(tracked()) == [], "move them to toolkit/assets/ (if they ship) or keep them out of git"


def test_the_lab_is_not_installed():
    """pyproject.toml installs the library, evaluation and the GUI; training/ (the voice lab) runs from a checkout."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]

    def installed(name):
        return any(fnmatch.fnmatch(name, p) for p in found)

    assert all(map(installed, ["toolkit", "toolkit.models", "evaluation", "gui"]))
    assert not any(map(installed, ["training", "training.voice"]))
    assert not (ROOT / "toolkit" / "voice").exists()
