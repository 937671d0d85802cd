"""Nothing secret ships: no key material in what the image copies, none in the rendered manifests.

The image's build context is what .dockerignore re-includes (tests/deploy/test_dockerfile.py checks that
the Dockerfile copies exactly that); certificates and keys reach pods only at run time, by the flags
--tls-cert, --tls-key and --tls-ca pointing into a mounted Secret. That no service writes key material
to its logs is checked in test_tls.py, on a fleet running mutual TLS at DEBUG level.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy.manifests import OVERLAYS, REPO_ROOT, render

SECRET_FILE_SUFFIXES = (".pem", ".key", ".crt", ".p12", ".pfx", ".jks", ".env")
KEY_MATERIAL = re.compile(r"-----BEGIN [A-Z ]*(PRIVATE KEY|CERTIFICATE)-----")


def image_files() -> list[Path]:
    """Every file of the build context: the re-included paths of .dockerignore, without ignored caches."""
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    included = [line.removeprefix("!").rstrip("/") for line in lines if line.startswith("!")]
    files = []
    for source in included:
        path = REPO_ROOT / source
        for file in [path] if path.is_file() else sorted(path.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                files.append(file)
    return files


def test_the_image_copies_no_key_or_certificate() -> None:
    files = image_files()
    assert any(file.name == "server.py" for file in files)  # the context is really what was walked
    for file in files:
        assert not file.name.endswith(SECRET_FILE_SUFFIXES), file
        assert not KEY_MATERIAL.search(file.read_text(errors="replace")), file


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_manifests_carry_no_key_material(overlay: str) -> None:
    assert not KEY_MATERIAL.search(render(f"overlays/{overlay}"))
