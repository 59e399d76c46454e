"""OCI platforms (``os/arch[/variant]``): parsing, normalisation and matching.

An artifact lists the platforms it was built for; a node runs exactly one.  Both sides are
written by people and tools that disagree on spelling (``x86_64`` vs ``amd64``, ``aarch64``
vs ``arm64``), so every platform is normalised once, here, and compared only in normal form.

Normalisation (after the conventions of containerd's ``platforms`` package):

* os and arch are lower-cased;
* arch aliases: ``x86_64``/``x86-64`` → ``amd64``, ``aarch64`` → ``arm64``,
  ``armhf`` → ``arm/v7``, ``armel`` → ``arm/v6``, ``i386``/``i686``/``x86`` → ``386``;
* ``arm64`` without a variant means ``arm64/v8``; ``arm`` without a variant means ``arm/v7``;
  ``amd64/v1`` is plain ``amd64``.

Two platforms match when their normal forms are equal.  Only known operating systems and
architectures (Go's ``GOOS``/``GOARCH`` names, which OCI uses) are accepted, so a typo such as
``linux/amd46`` is an ``Invalid`` error instead of a platform no node will ever offer.  The same
holds for variants: only :data:`KNOWN_VARIANTS` — the levels Go's ``GOAMD64``, ``GOARM``,
``GOARM64``, ``GO386``, ``GOMIPS``, ``GOPPC64`` and ``GORISCV64`` name — so ``linux/amd64/v99``
is refused.  (A variant is not checked against its architecture: ``linux/s390x/v7`` parses.)
"""

from __future__ import annotations

import platform as host_platform
import re
from collections.abc import Iterable
from typing import Any

from pydantic import StrictStr, model_serializer, model_validator

from berth.errors import Invalid
from berth.validation import BerthModel, shown

__all__ = [
    "KNOWN_ARCHITECTURES",
    "KNOWN_OPERATING_SYSTEMS",
    "KNOWN_VARIANTS",
    "Platform",
    "host",
    "matches_any",
]

KNOWN_OPERATING_SYSTEMS = frozenset(
    {
        "aix",
        "android",
        "darwin",
        "dragonfly",
        "freebsd",
        "illumos",
        "ios",
        "js",
        "linux",
        "netbsd",
        "openbsd",
        "plan9",
        "solaris",
        "wasip1",
        "windows",
    }
)
KNOWN_ARCHITECTURES = frozenset(
    {
        "386",
        "amd64",
        "arm",
        "arm64",
        "loong64",
        "mips",
        "mips64",
        "mips64le",
        "mipsle",
        "ppc64",
        "ppc64le",
        "riscv64",
        "s390x",
        "wasm",
    }
)

KNOWN_VARIANTS = frozenset(
    {f"v{major}" for major in range(1, 10)}
    | {f"v8.{minor}" for minor in range(10)}
    | {f"v9.{minor}" for minor in range(6)}
    | {"sse2", "softfloat", "hardfloat", "power8", "power9", "power10", "rva20u64", "rva22u64"}
)

_ARCH_ALIASES: dict[str, tuple[str, str]] = {
    "x86_64": ("amd64", ""),
    "x86-64": ("amd64", ""),
    "aarch64": ("arm64", ""),
    "armhf": ("arm", "v7"),
    "armel": ("arm", "v6"),
    "i386": ("386", ""),
    "i686": ("386", ""),
    "x86": ("386", ""),
}
_DEFAULT_VARIANT = {"arm64": "v8", "arm": "v7"}
_PART = re.compile(r"^[a-z0-9_.-]+$")


class Platform(BerthModel):
    """A normalised OCI platform.  Build one with :meth:`parse` or ``Platform(os=…, arch=…)``.

    Serialises to (and validates from) its string form, ``"linux/arm64/v8"``.
    """

    os: StrictStr
    arch: StrictStr
    variant: StrictStr = ""

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        if isinstance(data, str):
            return _split(data)
        return data

    @model_validator(mode="after")
    def _normalise(self) -> Platform:
        os_name, arch, variant = _normalise(self.os, self.arch, self.variant)
        object.__setattr__(self, "os", os_name)
        object.__setattr__(self, "arch", arch)
        object.__setattr__(self, "variant", variant)
        return self

    @model_serializer
    def _to_text(self) -> str:
        return str(self)

    @classmethod
    def parse(cls, text: str | Platform, *, field: str = "platform") -> Platform:
        """Parse ``os/arch[/variant]``; raise ``Invalid`` naming ``field`` when malformed."""
        if isinstance(text, Platform):
            return text
        if not isinstance(text, str):
            raise Invalid(
                f"expected a platform string such as 'linux/amd64', got {shown(text)}", field=field
            )
        try:
            os_name, arch, variant = _normalise(**_split(text))
        except Invalid as error:
            raise Invalid(error.message, field=field) from None
        return cls.model_construct(os=os_name, arch=arch, variant=variant)

    def matches(self, other: Platform) -> bool:
        """True when both name the same normalised platform."""
        return self == other

    def __str__(self) -> str:
        return f"{self.os}/{self.arch}/{self.variant}" if self.variant else f"{self.os}/{self.arch}"


def _split(text: str) -> dict[str, str]:
    parts = text.strip().split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise Invalid(
            f"{shown(text)} is not a platform of the form <os>/<arch>[/<variant>]", field="platform"
        )
    return {"os": parts[0], "arch": parts[1], "variant": parts[2] if len(parts) == 3 else ""}


def _normalise(os: str, arch: str, variant: str = "") -> tuple[str, str, str]:
    os_name, arch, variant = os.strip().lower(), arch.strip().lower(), variant.strip().lower()
    for name, value in (("os", os_name), ("arch", arch)):
        if not value or not _PART.match(value):
            raise Invalid(
                f"platform {name} {shown(value)} is empty or has invalid characters", field=name
            )
    if variant and not _PART.match(variant):
        raise Invalid(f"platform variant {shown(variant)} has invalid characters", field="variant")
    if variant and variant not in KNOWN_VARIANTS:
        raise Invalid(
            f"unknown platform variant {shown(variant)}; known: v1-v9, v8.0-v8.9, v9.0-v9.5, "
            + ", ".join(sorted(v for v in KNOWN_VARIANTS if not v.startswith("v"))),
            field="variant",
        )
    if arch in _ARCH_ALIASES:
        arch, alias_variant = _ARCH_ALIASES[arch]
        variant = variant or alias_variant
    if os_name not in KNOWN_OPERATING_SYSTEMS:
        raise Invalid(
            f"unknown operating system {shown(os_name)}; "
            f"known: {', '.join(sorted(KNOWN_OPERATING_SYSTEMS))}",
            field="os",
        )
    if arch not in KNOWN_ARCHITECTURES:
        raise Invalid(
            f"unknown architecture {shown(arch)}; known: {', '.join(sorted(KNOWN_ARCHITECTURES))}",
            field="arch",
        )
    if arch == "amd64" and variant == "v1":
        variant = ""
    variant = variant or _DEFAULT_VARIANT.get(arch, "")
    return os_name, arch, variant


def matches_any(node: Platform, requested: Iterable[Platform]) -> bool:
    """Whether ``node`` can run an artifact offering ``requested``; empty means any."""
    wanted = tuple(requested)
    return not wanted or node in wanted


def host() -> Platform:
    """The platform of the machine berth runs on (``linux/amd64`` on a typical server)."""
    system = host_platform.system().lower() or "linux"
    return Platform.parse(f"{system}/{host_platform.machine() or 'amd64'}", field="host")
