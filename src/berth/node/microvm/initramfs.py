"""The guest's init: a busybox initramfs berth writes itself, and the per-boot config archive.

This module owns what runs inside a microVM before and around the workload.  The initramfs
(:func:`build_initramfs`) holds a static busybox, the few kernel modules the Debian cloud
kernel keeps outside its image (virtio-mmio, virtio-blk, erofs, overlayfs — the rest is
built in), ``/dev/console`` and :data:`INIT_SCRIPT` as ``/init``.  A boot appends a second,
tiny archive (:func:`config_archive`) holding ``/berth/config``: Linux unpacks concatenated
``newc`` archives into one root, so the per-boot part costs one small file and no disk.

What the init does, in order (every step that can fail prints a ``boot-failed`` line and
powers off, so the host never waits for a guest that cannot start):

1. mount ``devtmpfs``, ``proc``, ``sysfs``; load the modules;
2. find its disks by their virtio serial numbers (``berth-layer-<i>``, ``berth-upper``) —
   never by ``/dev/vdX`` order, which depends on probe order;
3. mount each layer read-only (erofs), the upper disk (ext4; or a ``tmpfs`` when the
   workload has no disk budget), and stack them with overlayfs at ``/newroot``:
   ``lowerdir`` lists the topmost layer first, as overlayfs reads it;
4. look the program up inside the image (its ``PATH``, symlinks resolved inside the image)
   and report ``boot-failed not-found`` if it is not there;
5. print ``running`` and run the workload — ``env -i`` with exactly its environment,
   entering the image as root directory and its working directory (busybox ``nsenter -r
   -w``), as the image's user (``-S``/``-G``, names looked up in the image's ``/etc/passwd``
   and ``/etc/group``), stdin ``/dev/null``, output on the console.  ``running`` comes
   *first*: the host keeps the console's lines only from it on (what comes before is boot
   chatter), and a workload started first could print, even end, before it — a short one
   on a loaded host lost its output that way;
6. on a ``berth-stop`` line on the console, ``SIGTERM`` every process but init;
7. when the workload ends, print ``exit <status> <oom kills>`` (the shell's status: 128 + the
   signal for a killed process; the kernel's ``oom_kill`` counter) and power off.

Protocol lines are ``berth:<nonce>:<event> …`` with a random nonce per boot
(:mod:`berth.node.microvm.guest` parses them), so workload output that merely looks like one
is not mistaken for it.  The config is shell code, but only berth writes it: every value in
it is quoted with :func:`shlex.quote` (single quotes; no NUL can occur, :class:`BootSpec`
refuses it), so arguments and environment values reach the workload byte for byte.
"""

from __future__ import annotations

import shlex
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from berth.errors import Invalid

__all__ = [
    "GUEST_PATH",
    "INIT_SCRIPT",
    "MODULES",
    "CpioEntry",
    "GuestConfig",
    "build_initramfs",
    "config_archive",
    "newc_archive",
]

MODULES: tuple[str, ...] = (
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_blk",
    "libcrc32c",
    "erofs",
    "overlay",
)
"""The modules the init loads, in dependency order (``modules.dep`` of the cloud kernel:
``virtio`` needs ``virtio_ring``, ``virtio_mmio``/``virtio_blk`` both, ``erofs``
``libcrc32c``).  ext4, tmpfs, devtmpfs and the 8250 console are built into that kernel."""

GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The workload's ``PATH`` when its environment does not set one (containerd's default)."""

INIT_SCRIPT = r"""#!/bin/busybox sh
# berth's microVM init (berth.node.microvm.initramfs): mount, stack, run, report, power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
stty -F /dev/console -echo 2>/dev/null
. /berth/config
say() { echo "berth:$BERTH_NONCE:$*"; }
halt_now() { sync; poweroff -f; sleep 5; }
fail() { say "boot-failed $*"; halt_now; }
for module in virtio_ring virtio virtio_mmio virtio_blk libcrc32c erofs overlay; do
  insmod "/lib/modules/$module.ko" 2>/dev/null || fail "module $module"
done
say ready
if [ "$BERTH_PROBE" = 1 ]; then say probe-ok; halt_now; fi
# Disks by serial number; virtio-blk probes asynchronously, so wait for all of them.
want=$((BERTH_LAYERS + BERTH_UPPER_DISK))
tries=0
while :; do
  found=0
  for dev in /sys/block/vd*; do
    [ -e "$dev/serial" ] || continue
    serial=$(cat "$dev/serial")
    case "$serial" in berth-layer-*|berth-upper) found=$((found + 1)) ;; esac
  done
  [ "$found" -ge "$want" ] && break
  tries=$((tries + 1))
  [ "$tries" -gt 400 ] && fail "disks $found/$want"
  usleep 25000
done
lower=""
for dev in /sys/block/vd*; do
  [ -e "$dev/serial" ] || continue
  serial=$(cat "$dev/serial")
  name=${dev##*/}
  case "$serial" in
    berth-layer-*)
      index=${serial#berth-layer-}
      mkdir -p "/layers/$index"
      mount -t erofs -o ro "/dev/$name" "/layers/$index" || fail "mount layer-$index"
      ;;
    berth-upper)
      mount -t ext4 -o noatime "/dev/$name" /upper || fail "mount upper"
      ;;
  esac
done
index=0
while [ "$index" -lt "$BERTH_LAYERS" ]; do
  if [ -z "$lower" ]; then lower="/layers/$index"; else lower="/layers/$index:$lower"; fi
  index=$((index + 1))
done
[ -n "$lower" ] || { mkdir -p /layers/empty; lower=/layers/empty; }
if [ "$BERTH_UPPER_DISK" != 1 ]; then
  mount -t tmpfs -o "size=$BERTH_TMPFS_SIZE" upper /upper || fail "mount upper"
fi
mkdir -p /upper/data /upper/work
mount -t overlay overlay -o "lowerdir=$lower,upperdir=/upper/data,workdir=/upper/work" \
  /newroot || fail overlay
for dir in proc sys dev tmp; do
  [ -d "/newroot/$dir" ] || mkdir -p "/newroot/$dir"
done
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
hostname "$BERTH_HOSTNAME"
mkdir -p "/newroot$BERTH_WORKDIR" || fail workdir
# The program, looked up inside the image (its PATH, from its working directory).
mkdir /newroot/.berth-lookup && : > /newroot/.berth-lookup/busybox || fail "upper read-only"
mount --bind /bin/busybox /newroot/.berth-lookup/busybox
env -i PATH="$BERTH_PATH" nsenter -r/newroot "-w/newroot$BERTH_WORKDIR" -F \
  /.berth-lookup/busybox sh -c '
  case "$1" in
    */*) [ -f "$1" ] && [ -x "$1" ] && exit 0 ;;
    *) IFS=:; for dir in $PATH; do [ -f "$dir/$1" ] && [ -x "$dir/$1" ] && exit 0; done ;;
  esac
  exit 1' sh "$BERTH_PROGRAM"
looked=$?
umount /newroot/.berth-lookup/busybox
rm -rf /newroot/.berth-lookup
[ "$looked" = 0 ] || fail not-found
# The user the image names (OCI "User": uid, name, uid:gid, name:group), looked up in its
# /etc/passwd and /etc/group; root when it names none.
ids=""
if [ -n "$BERTH_USER" ]; then
  user=${BERTH_USER%%:*}
  group=""
  case "$BERTH_USER" in *:*) group=${BERTH_USER#*:} ;; esac
  case "$user" in
    *[!0-9]*)
      entry=$(awk -F: -v u="$user" '$1 == u { print $3 ":" $4; exit }' /newroot/etc/passwd)
      [ -n "$entry" ] || fail user
      uid=${entry%%:*}
      gid=${entry#*:}
      ;;
    *)
      uid=$user
      gid=$(awk -F: -v u="$user" '$3 == u { print $4; exit }' /newroot/etc/passwd)
      ;;
  esac
  case "$group" in
    "") ;;
    *[!0-9]*)
      gid=$(awk -F: -v g="$group" '$1 == g { print $3; exit }' /newroot/etc/group)
      [ -n "$gid" ] || fail group
      ;;
    *) gid=$group ;;
  esac
  case "$uid:${gid:-0}" in *[!0-9:]*) fail user ;; esac
  ids="-S $uid -G ${gid:-0}"
fi
eval "set -- $BERTH_ENV_WORDS /bin/nsenter -r/newroot \"-w/newroot\$BERTH_WORKDIR\" $ids -F \
  $BERTH_COMMAND_WORDS"
say running
env -i -- "$@" </dev/null &
child=$!
(
  while read -r line; do
    [ "$line" = berth-stop ] && kill -TERM -1
  done
) </dev/console &
watcher=$!
wait "$child"
status=$?
oom=$(sed -n 's/^oom_kill //p' /proc/vmstat)
kill -KILL "$watcher" 2>/dev/null
say "exit $status ${oom:-0}"
halt_now
"""
"""``/init``.  It runs ``env -i -- K=V … /bin/nsenter -r/newroot -w/newroot/WORKDIR [-S UID -G
GID] -F PROGRAM ARGS…``: busybox ``nsenter`` enters the image as its root and working
directory (``chroot`` would start the workload in ``/``) as the image's user.  The config
gives the environment and the command as lists of single-quoted words, which ``eval`` turns
back into exactly those words."""


@dataclass(frozen=True, slots=True)
class CpioEntry:
    """One member of a ``newc`` archive: a path (no leading ``/``), its mode (with the file
    type bits), its content for a regular file or target for a symlink, a device number."""

    name: str
    mode: int
    data: bytes = b""
    rdev_major: int = 0
    rdev_minor: int = 0


def newc_archive(entries: Iterable[CpioEntry]) -> bytes:
    """A ``newc`` (SVR4, no checksum) cpio archive of ``entries``, as the kernel unpacks it.

    Owner root, modification time 0 (reproducible), one link each, inode numbers from 1.
    """
    out = bytearray()
    number = 0
    for number, entry in enumerate([*entries, CpioEntry("TRAILER!!!", 0)], start=1):
        name = entry.name.encode()
        trailer = entry.name == "TRAILER!!!"
        fields = (
            0 if trailer else number,
            entry.mode,
            0,
            0,
            1,
            0,
            len(entry.data),
            0,
            0,
            entry.rdev_major,
            entry.rdev_minor,
            len(name) + 1,
            0,
        )
        out += b"070701" + b"".join(b"%08X" % value for value in fields)
        out += name + b"\0"
        out += b"\0" * (-len(out) % 4)
        out += entry.data
        out += b"\0" * (-len(out) % 4)
    del number
    return bytes(out)


def build_initramfs(busybox: Path, modules: Mapping[str, Path], target: Path) -> int:
    """Write the base initramfs to ``target`` (atomically); return its size in bytes.

    ``busybox`` is a *static* busybox binary; ``modules`` maps each name of :data:`MODULES`
    to its ``.ko`` file.  Uncompressed: nothing for the guest to inflate, and the per-boot
    config archive is appended as is.
    """
    missing = [name for name in MODULES if name not in modules]
    if missing:
        raise Invalid(f"kernel modules missing: {', '.join(missing)}", field="modules")
    directory = stat.S_IFDIR | 0o755
    folders = (
        "bin",
        "dev",
        "proc",
        "sys",
        "newroot",
        "layers",
        "upper",
        "berth",
        "lib",
        "lib/modules",
        "tmp",
    )
    entries = [CpioEntry(name, directory) for name in folders]
    entries.append(CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev_major=5, rdev_minor=1))
    entries.append(CpioEntry("bin/busybox", stat.S_IFREG | 0o755, busybox.read_bytes()))
    entries.append(CpioEntry("bin/sh", stat.S_IFLNK | 0o777, b"busybox"))
    for name in MODULES:
        entries.append(
            CpioEntry(f"lib/modules/{name}.ko", stat.S_IFREG | 0o644, modules[name].read_bytes())
        )
    entries.append(CpioEntry("init", stat.S_IFREG | 0o755, INIT_SCRIPT.encode()))
    data = newc_archive(entries)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    partial.replace(target)
    return len(data)


@dataclass(frozen=True, slots=True)
class GuestConfig:
    """What one boot tells its init: the workload, its environment, its disks."""

    nonce: str
    command: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    layers: int = 0
    upper_disk: bool = False
    tmpfs_size: int = 0
    hostname: str = "berth"
    probe: bool = False
    workdir: str = "/"
    """The workload's working directory inside the image (absolute; made if missing)."""
    user: str = ""
    """The image's user (``uid``, ``name``, ``uid:gid``, ``name:group``; empty: root)."""

    def __post_init__(self) -> None:
        if not self.workdir.startswith("/") or "\0" in self.workdir:
            raise Invalid(f"not an absolute path: {self.workdir!r}", field="workdir")
        if not self.user.isprintable() or self.user.count(":") > 1 or " " in self.user:
            raise Invalid(f"not a user: {self.user!r}", field="user")

    def script(self) -> str:
        """``/berth/config``: shell assignments, every value quoted."""
        env = dict(self.env or {})
        env.setdefault("PATH", GUEST_PATH)
        q = shlex.quote

        def words(values: Iterable[str]) -> str:
            return q(" ".join(q(value) for value in values))

        lines = [
            f"BERTH_NONCE={q(self.nonce)}",
            f"BERTH_PROBE={1 if self.probe else 0}",
            f"BERTH_LAYERS={int(self.layers)}",
            f"BERTH_UPPER_DISK={1 if self.upper_disk else 0}",
            f"BERTH_TMPFS_SIZE={int(self.tmpfs_size)}",
            f"BERTH_HOSTNAME={q(self.hostname)}",
            f"BERTH_PATH={q(env['PATH'])}",
            f"BERTH_PROGRAM={q(self.command[0] if self.command else '')}",
            f"BERTH_WORKDIR={q(self.workdir)}",
            f"BERTH_USER={q(self.user)}",
            f"BERTH_ENV_WORDS={words(f'{key}={value}' for key, value in env.items())}",
            f"BERTH_COMMAND_WORDS={words(self.command)}",
        ]
        return "\n".join(lines) + "\n"


def config_archive(config: GuestConfig) -> bytes:
    """The per-boot archive appended to the base initramfs: ``/berth/config`` alone."""
    return newc_archive([CpioEntry("berth/config", stat.S_IFREG | 0o644, config.script().encode())])
