"""patches/ is what `python scripts/regen_patches.py patches/` generates today, and each
committed patch applies with git apply to its pristine release."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from kvpatch.source.releases import REVISIONS

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("regen_patches", REPO / "scripts" / "regen_patches.py")
patches = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(patches)
COMMITTED = REPO / "patches"

pytestmark = [pytest.mark.network, pytest.mark.slow]


def test_regenerating_gives_the_committed_patches(
    tmp_path: Path, release_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVPATCH_CACHE", str(release_cache))
    written = patches.regenerate(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in COMMITTED.iterdir())
    for path in written:
        assert path.read_text() == (COMMITTED / path.name).read_text(), (
            f"patches/{path.name} is stale: run python scripts/regen_patches.py patches/"
        )


@pytest.mark.parametrize("release", [r for r, _, _ in REVISIONS])
def test_committed_patch_applies_to_its_release(release: str, vllm_release, tmp_path: Path) -> None:
    tree = vllm_release(release)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--local", str(tree), str(clone)], check=True)
    patch_file = COMMITTED / patches.patch_name(release)
    check = subprocess.run(["git", "apply", "--check", str(patch_file)], cwd=clone, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    dry = subprocess.run(
        ["patch", "-p1", "--dry-run", "-i", str(patch_file)], cwd=clone, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
