"""berth.node.erofs: OCI layer blobs converted to erofs images, checked with erofs-utils.

Contents are read back without mounting: ``fsck.erofs --extract`` for the tree (files,
modes, owners, symlinks, devices), ``dump.erofs`` for inode numbers (hard links) and a small
reader of an inode's inline extended attributes for the opaque marker.  One test also mounts
the images under a real overlayfs when this machine allows it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import shutil
import stat
import struct
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth.errors import Invalid
from berth.node.erofs import (
    OPAQUE_XATTR,
    SCRATCH_PREFIX,
    SHARED_MEMORY,
    ConversionUnavailable,
    convert_layer,
    remove_leftovers,
    scratch_for,
    unpacked_estimate,
)
from berth.oci import (
    ImageSpec,
    LayerCompression,
    LayerSource,
    OciLayer,
    TarMember,
    directory,
    file,
    hardlink,
    opaque,
    read_layout,
    symlink,
    whiteout,
    write_layout,
)

pytestmark = [
    pytest.mark.skipif(
        shutil.which("mkfs.erofs") is None,
        reason="mkfs.erofs not installed (apt-get install erofs-utils)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="layer conversion needs root (mknod, chown)"),
]


def _layer(
    tmp_path: Path, source: LayerSource, compression: LayerCompression = "gzip", name: str = "l"
) -> OciLayer:
    root = write_layout(
        tmp_path / f"layout-{name}", ImageSpec(layers=[source]), compression=compression
    )
    return read_layout(root).layers[0]


def _extract(image: Path, out: Path) -> Path:
    subprocess.run(["fsck.erofs", f"--extract={out}", str(image)], check=True, capture_output=True)
    return out


def _nid(image: Path, path: str) -> int:
    shown = subprocess.run(
        ["dump.erofs", f"--path={path}", str(image)], check=True, capture_output=True, text=True
    )
    match = re.search(r"NID:\s*(\d+)", shown.stdout)
    assert match, shown.stdout
    return int(match.group(1))


_XATTR_PREFIXES = {1: "user.", 4: "trusted.", 6: "security."}


def _inode(image: Path, path: str) -> tuple[bytes, int]:
    """The image's bytes and the offset of ``path``'s inode (on-disk format, erofs_fs.h)."""
    data = image.read_bytes()
    meta_blkaddr = struct.unpack_from("<I", data, 1024 + 40)[0]
    block_size = 1 << data[1024 + 12]
    return data, meta_blkaddr * block_size + _nid(image, path) * 32


def _mode(image: Path, path: str) -> int:
    """``i_mode`` of ``path`` as stored (fsck.erofs --extract and dump.erofs drop setuid)."""
    data, inode = _inode(image, path)
    mode: int = struct.unpack_from("<H", data, inode + 4)[0]
    return mode


def _inline_xattrs(image: Path, path: str) -> dict[str, bytes]:
    """The inline xattrs of ``path``'s inode."""
    data, inode = _inode(image, path)
    i_format, xattr_icount = struct.unpack_from("<HH", data, inode)
    if xattr_icount == 0:
        return {}
    inode_size = 64 if i_format & 1 else 32
    end = inode + inode_size + 12 + (xattr_icount - 1) * 4
    shared_count = data[inode + inode_size + 4]
    offset = inode + inode_size + 12 + shared_count * 4
    found: dict[str, bytes] = {}
    while offset + 4 <= end:
        name_len, name_index, value_size = struct.unpack_from("<BBH", data, offset)
        name = data[offset + 4 : offset + 4 + name_len].decode()
        value = data[offset + 4 + name_len : offset + 4 + name_len + value_size]
        found[_XATTR_PREFIXES.get(name_index, "?") + name] = value
        offset += (4 + name_len + value_size + 3) & ~3
    return found


BASE = [
    directory("bin"),
    file("bin/sh", b"#!shell\n", 0o755),
    file("bin/su", b"root me", 0o4755),
    symlink("bin/ls", "sh"),
    symlink("bin/abs", "/bin/sh"),
    hardlink("bin/sh2", "bin/sh"),
    directory("etc"),
    file("etc/passwd", "root:x:0:0\n"),
    file("etc/shadow", "secret", 0o640, uid=0, gid=42),
    directory("home/app"),
    file("home/app/notes", "mine", 0o600, uid=1000, gid=1000),
]
APP = [
    directory("bin"),
    whiteout("bin/ls"),
    directory("etc"),
    opaque("etc"),
    file("etc/hostname", "vm\n"),
    directory("app"),
    file("app/main.py", "print('hi')\n"),
]


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_modes_owners_links_are_kept(tmp_path: Path, compression: LayerCompression) -> None:
    layer = _layer(tmp_path, BASE, compression)
    image = convert_layer(layer, tmp_path / "img" / "base.erofs")
    assert image.path.stat().st_size == image.size > 0
    out = _extract(image.path, tmp_path / "out")
    assert (out / "bin/sh").read_bytes() == b"#!shell\n"
    assert _mode(image.path, "/bin/su") == stat.S_IFREG | 0o4755
    assert _mode(image.path, "/etc/shadow") == stat.S_IFREG | 0o640
    assert os.readlink(out / "bin/ls") == "sh"
    assert os.readlink(out / "bin/abs") == "/bin/sh"
    shadow = (out / "etc/shadow").stat()
    assert (stat.S_IMODE(shadow.st_mode), shadow.st_uid, shadow.st_gid) == (0o640, 0, 42)
    notes = (out / "home/app/notes").stat()
    assert (notes.st_uid, notes.st_gid, stat.S_IMODE(notes.st_mode)) == (1000, 1000, 0o600)
    assert _nid(image.path, "/bin/sh") == _nid(image.path, "/bin/sh2")  # one inode
    assert _nid(image.path, "/bin/sh") != _nid(image.path, "/bin/su")


def test_whiteouts_and_opaque_directories(tmp_path: Path) -> None:
    image = convert_layer(_layer(tmp_path, APP), tmp_path / "img" / "app.erofs")
    out = _extract(image.path, tmp_path / "out")
    gone = (out / "bin/ls").lstat()
    assert stat.S_ISCHR(gone.st_mode) and gone.st_rdev == os.makedev(0, 0)
    assert sorted(os.listdir(out / "bin")) == ["ls"]
    assert sorted(os.listdir(out / "etc")) == ["hostname"]  # the marker itself is not content
    assert _inline_xattrs(image.path, "/etc") == {OPAQUE_XATTR: b"y"}
    assert _inline_xattrs(image.path, "/app") == {}


def test_mtimes_are_kept(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("x = 1\n")
    os.utime(source / "pkg" / "mod.py", (1_600_000_000, 1_600_000_000))
    layer = read_layout(write_layout(tmp_path / "l", ImageSpec(layers=[source]))).layers[0]
    # The writer zeroes mtimes for reproducibility; rebuild the tar keeping this one.
    import io
    import tarfile

    buffer = io.BytesIO()
    with (
        gzip.open(layer.path) as raw,
        tarfile.open(fileobj=raw, mode="r|") as tar_in,
        tarfile.open(fileobj=buffer, mode="w") as tar_out,
    ):
        for member in tar_in:
            member.mtime = 1_600_000_000 if member.name.endswith(".py") else 1_500_000_000
            tar_out.addfile(member, tar_in.extractfile(member) if member.isreg() else None)
    layer = _layer(tmp_path, buffer.getvalue(), name="mtime")
    out = _extract(convert_layer(layer, tmp_path / "m.erofs").path, tmp_path / "out")
    assert (out / "pkg" / "mod.py").stat().st_mtime == 1_600_000_000
    assert (out / "pkg").stat().st_mtime == 1_500_000_000


def test_existing_image_is_returned_as_is(tmp_path: Path) -> None:
    layer = _layer(tmp_path, BASE)
    first = convert_layer(layer, tmp_path / "img" / "x.erofs")
    again = convert_layer(layer, tmp_path / "img" / "x.erofs")
    assert again.path == first.path and again.seconds == 0.0 and again.size == first.size


def test_same_digest_gives_the_same_size(tmp_path: Path) -> None:
    layer = _layer(tmp_path, BASE)
    first = convert_layer(layer, tmp_path / "a.erofs")
    second = convert_layer(layer, tmp_path / "b.erofs")
    assert first.size == second.size


def test_concurrent_conversions_of_one_digest(tmp_path: Path) -> None:
    layer = _layer(tmp_path, BASE + [file(f"data/{i}", os.urandom(4096)) for i in range(50)])
    dest = tmp_path / "img" / "x.erofs"
    results: list[object] = []

    def run() -> None:
        try:
            results.append(convert_layer(layer, dest))
        except Exception as error:  # pragma: no cover - reported below
            results.append(error)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(not isinstance(result, Exception) for result in results), results
    assert os.listdir(dest.parent) == ["x.erofs"]
    out = _extract(dest, tmp_path / "out")
    assert len(os.listdir(out / "data")) == 50


def _raw_tar(tmp_path: Path, members: list[TarMember]) -> OciLayer:
    return _layer(tmp_path, members, name="bad")


def _tampered(tmp_path: Path) -> OciLayer:
    layer = _layer(tmp_path, BASE, "none")
    data = bytearray(layer.path.read_bytes())
    data[600] ^= 0x01  # inside the first file's content: the tar still parses
    layer.path.write_bytes(bytes(data))
    return layer


def _truncated(tmp_path: Path) -> OciLayer:
    layer = _layer(tmp_path, BASE)
    layer.path.write_bytes(layer.path.read_bytes()[:-30])
    return OciLayer(layer.digest, layer.size - 30, layer.media_type, layer.compression, layer.path)


def _not_gzip(tmp_path: Path) -> OciLayer:
    layer = _layer(tmp_path, BASE, "none")
    return OciLayer(
        layer.digest, layer.size, "application/vnd.oci.image.layer.v1.tar+gzip", "gzip", layer.path
    )


BAD = [
    ("absolute", lambda p: _raw_tar(p, [file("/etc/passwd", "x")]), "is an absolute path"),
    ("dotdot", lambda p: _raw_tar(p, [file("a/../../etc/passwd", "x")]), "leaves the layer's root"),
    (
        "through symlink",
        lambda p: _raw_tar(p, [symlink("etc", "/etc"), file("etc/evil", "x")]),
        "goes through the symbolic link 'etc'",
    ),
    (
        "hardlink outside",
        lambda p: _raw_tar(p, [hardlink("x", "../../etc/passwd")]),
        "leaves the layer's root",
    ),
    ("hardlink missing", lambda p: _raw_tar(p, [hardlink("x", "nope")]), "not an earlier file"),
    ("whiteout of nothing", lambda p: _raw_tar(p, [file("d/.wh.", "")]), "names nothing"),
    (
        "below a whiteout",
        lambda p: _raw_tar(p, [file("d/.wh.x/y", "")]),
        "below the whiteout '.wh.x'",
    ),
    ("tampered", _tampered, "hashes to sha256:"),
    ("truncated", _truncated, "not a valid gzip stream"),
    ("not gzip", _not_gzip, "not a valid gzip stream"),
]


@pytest.mark.parametrize(("make", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_layers_are_refused_leaving_nothing(tmp_path: Path, make: object, message: str) -> None:
    layer = make(tmp_path)  # type: ignore[operator]
    images = tmp_path / "img"
    images.mkdir()
    (images / "other.erofs").write_bytes(b"kept")
    with pytest.raises(Invalid, match=re.escape(message)) as error:
        convert_layer(layer, images / "x.erofs")
    assert error.value.field == f"layer {layer.digest}"
    assert os.listdir(images) == ["other.erofs"]
    assert not Path("/etc/evil").exists()
    assert _ours_in(SHARED_MEMORY) == []


def _ours_in(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return [
        name for name in os.listdir(directory) if name.startswith(f"{SCRATCH_PREFIX}{os.getpid()}-")
    ]


@pytest.mark.parametrize("where", ["beside", "elsewhere"])
def test_an_explicit_scratch_directory_is_used_and_emptied(tmp_path: Path, where: str) -> None:
    scratch = tmp_path / "img" if where == "beside" else tmp_path / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    layer = _layer(tmp_path, APP)
    image = convert_layer(layer, tmp_path / "img" / "x.erofs", scratch_dir=scratch)
    assert _inline_xattrs(image.path, "/etc") == {OPAQUE_XATTR: b"y"}
    assert os.listdir(tmp_path / "img") == ["x.erofs"]
    assert os.listdir(scratch) == (["x.erofs"] if where == "beside" else [])


def test_a_bad_layer_leaves_nothing_in_an_explicit_scratch(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(Invalid):
        bad = _raw_tar(tmp_path, [file("ok", "x"), file("/abs", "x")])
        convert_layer(bad, tmp_path / "x.erofs", scratch_dir=scratch)
    assert os.listdir(scratch) == [] and not (tmp_path / "x.erofs").exists()


def test_size_estimates(tmp_path: Path) -> None:
    plain = _layer(tmp_path, BASE, "none", name="p")
    assert unpacked_estimate(plain) == plain.size
    packed = _layer(tmp_path, BASE, name="g")
    with gzip.open(packed.path) as raw:
        assert unpacked_estimate(packed) == len(raw.read())
    assert scratch_for(packed, tmp_path) in (SHARED_MEMORY, tmp_path)


def test_a_multi_member_gzip_that_outgrows_its_estimate_still_converts(tmp_path: Path) -> None:
    """The gzip trailer gives the last member's size only; extraction notices and moves."""
    plain = _layer(tmp_path, [file(f"f{i}", os.urandom(50_000)) for i in range(8)], "none")
    tar = plain.path.read_bytes()
    cut = len(tar) // 4
    blob = gzip.compress(tar[:cut], mtime=0) + gzip.compress(tar[cut:], mtime=0)
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    path = plain.path.with_name(digest.removeprefix("sha256:"))
    path.write_bytes(blob)
    layer = OciLayer(digest, len(blob), "application/vnd.oci.image.layer.v1.tar+gzip", "gzip", path)
    assert unpacked_estimate(layer) == len(tar) - cut  # the last member's size: too small
    scratch = tmp_path / "ram"
    scratch.mkdir()
    image = convert_layer(layer, tmp_path / "img" / "x.erofs", scratch_dir=scratch)
    out = _extract(image.path, tmp_path / "out")
    assert len(os.listdir(out)) == 8
    assert os.listdir(scratch) == [] and os.listdir(tmp_path / "img") == ["x.erofs"]


def test_leftovers_of_dead_processes_are_removed(tmp_path: Path) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    dead = tmp_path / f"{SCRATCH_PREFIX}{child.pid}-abc-1"
    (dead / "root").mkdir(parents=True)
    (tmp_path / f"{SCRATCH_PREFIX}{child.pid}-abc-2.erofs").write_text("x")
    live = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-abc-3"
    live.mkdir()
    other = tmp_path / "sha256-x.erofs"
    other.write_text("x")
    removed = remove_leftovers(tmp_path)
    assert sorted(path.name for path in removed) == sorted(
        [dead.name, f"{SCRATCH_PREFIX}{child.pid}-abc-2.erofs"]
    )
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, other.name])


def test_symlinks_planted_by_the_tar_are_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("intact")
    members = [
        symlink("f", str(victim)),
        file("f", "overwritten"),
    ]  # a later file replaces the link
    out = _extract(
        convert_layer(_raw_tar(tmp_path, members), tmp_path / "x.erofs").path, tmp_path / "o"
    )
    assert victim.read_text() == "intact"
    assert (out / "f").read_text() == "overwritten" and not (out / "f").is_symlink()


def test_missing_mkfs_is_reported_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layer = _layer(tmp_path, BASE)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConversionUnavailable, match=r"apt-get install erofs-utils"):
        convert_layer(layer, tmp_path / "x.erofs")
    assert not (tmp_path / "x.erofs").exists()


def test_not_root_is_refused_before_reading(tmp_path: Path) -> None:
    layer = _layer(tmp_path, BASE)
    os.seteuid(65534)  # the real uid stays root, so this process can switch back
    try:
        with pytest.raises(ConversionUnavailable, match="needs root"):
            convert_layer(layer, tmp_path / "x.erofs")
    finally:
        os.seteuid(0)
    assert not (tmp_path / "x.erofs").exists()


def _can_mount(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "none", str(probe)], capture_output=True, check=False
    )
    if result.returncode != 0:
        return False
    subprocess.run(["umount", str(probe)], check=False)
    return True


def test_overlayfs_reads_the_layers_as_a_container_would(tmp_path: Path) -> None:
    if not _can_mount(tmp_path):
        pytest.skip("this machine does not let us mount (no CAP_SYS_ADMIN)")
    base = convert_layer(_layer(tmp_path, BASE, name="b"), tmp_path / "base.erofs")
    app = convert_layer(_layer(tmp_path, APP, name="a"), tmp_path / "app.erofs")
    mounts: list[Path] = []
    try:
        for image in (base, app):
            target = tmp_path / f"m-{image.path.stem}"
            target.mkdir()
            command = ["mount", "-t", "erofs", "-o", "loop,ro", str(image.path), str(target)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                pytest.skip(f"cannot mount erofs here: {done.stderr.strip()}")
            mounts.append(target)
        merged = tmp_path / "merged"
        merged.mkdir()
        lower = f"{mounts[1]}:{mounts[0]}"  # top layer first
        command = ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower}", str(merged)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot mount overlayfs here: {done.stderr.strip()}")
        mounts.append(merged)
        assert sorted(os.listdir(merged / "bin")) == ["abs", "sh", "sh2", "su"]  # ls whited out
        assert sorted(os.listdir(merged / "etc")) == ["hostname"]  # opaque: base's etc hidden
        assert (merged / "app/main.py").read_text() == "print('hi')\n"
        assert (merged / "home/app/notes").read_text() == "mine"
    finally:
        for target in reversed(mounts):
            subprocess.run(["umount", str(target)], check=False)


def _tar_bytes(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info


def test_devices_xattrs_and_replacements(tmp_path: Path) -> None:
    capability = b"\x01\x00\x00\x02\x00\x20\x00\x00" + b"\x00" * 12  # cap_net_raw, permitted
    ping = _info("bin/ping", mode=0o755)
    ping.pax_headers = {
        "SCHILY.xattr.security.capability": capability.decode("utf-8", "surrogateescape"),
        "SCHILY.xattr.user.origin": "debian",
        "SCHILY.xattr.trusted.overlay.redirect": "/etc",  # never taken from a layer
    }
    entries = [
        (_info("dev", tarfile.DIRTYPE), b""),
        (_info("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666), b""),
        (_info("dev/loop0", tarfile.BLKTYPE, devmajor=7, devminor=0, mode=0o660), b""),
        (_info("run/pipe", tarfile.FIFOTYPE), b""),
        (ping, b"\x7fELF"),
        (_info("x"), b"a file first"),
        (_info("x", tarfile.DIRTYPE), b""),  # then a directory of that name
        (_info("x/inside"), b"in"),
        (_info("y", tarfile.DIRTYPE), b""),
        (_info("y/below"), b"gone with y"),
        (_info("y"), b"now a file"),
        (_info(".wh..wh.plnk", tarfile.DIRTYPE), b""),  # aufs bookkeeping: dropped
        (_info(".wh..wh.plnk/123.456"), b""),
    ]
    layer = _layer(tmp_path, _tar_bytes(entries))
    image = convert_layer(layer, tmp_path / "x.erofs")
    assert _mode(image.path, "/dev/null") == stat.S_IFCHR | 0o666
    assert _mode(image.path, "/dev/loop0") == stat.S_IFBLK | 0o660
    assert stat.S_ISFIFO(_mode(image.path, "/run/pipe"))
    assert _inline_xattrs(image.path, "/bin/ping") == {
        "security.capability": capability,
        "user.origin": b"debian",
    }
    out = _extract(image.path, tmp_path / "out")
    assert (out / "x" / "inside").read_bytes() == b"in"
    assert (out / "y").read_bytes() == b"now a file"
    assert ".wh..wh.plnk" not in os.listdir(out)


def test_a_member_below_a_file_is_refused(tmp_path: Path) -> None:
    layer = _layer(tmp_path, _tar_bytes([(_info("f"), b"x"), (_info("f/g"), b"y")]))
    with pytest.raises(Invalid, match="is below 'f', which is not a directory"):
        convert_layer(layer, tmp_path / "x.erofs")
    assert not (tmp_path / "x.erofs").exists()


def test_a_wrong_diff_id_or_size_is_refused(tmp_path: Path) -> None:
    layer = _layer(tmp_path, BASE)
    assert layer.diff_id is not None
    wrong_diff = OciLayer(
        layer.digest,
        layer.size,
        layer.media_type,
        layer.compression,
        layer.path,
        diff_id="sha256:" + "0" * 64,
    )
    with pytest.raises(Invalid, match="diff_id"):
        convert_layer(wrong_diff, tmp_path / "x.erofs")
    with layer.path.open("ab") as blob:
        blob.write(b"\0" * 10)  # trailing garbage after the gzip stream's end
    with pytest.raises(Invalid):
        convert_layer(layer, tmp_path / "x.erofs")
    assert os.listdir(tmp_path).count("x.erofs") == 0


_PARTS = st.sampled_from(["a", "b", "..", ".", ".wh.a", ".wh..wh..opq", ".wh..wh.plnk", ""])
_NAMES = st.lists(_PARTS, min_size=1, max_size=4).map("/".join) | st.just("/abs")


@st.composite
def _members(draw: st.DrawFn, outside: str) -> list[TarMember]:
    members: list[TarMember] = []
    for _ in range(draw(st.integers(1, 8))):
        name = draw(_NAMES)
        kind = draw(st.sampled_from(["file", "dir", "symlink", "hardlink"]))
        if kind == "file":
            members.append(file(name, b"x"))
        elif kind == "dir":
            members.append(directory(name))
        elif kind == "symlink":
            members.append(
                symlink(name, draw(st.sampled_from([outside, "../../outside", "a", "/"])))
            )
        else:
            members.append(hardlink(name, draw(_NAMES)))
    return members


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_no_tar_writes_outside_its_root(tmp_path: Path, data: st.DataObject) -> None:
    """Whatever the names, links and order: converted or refused, nothing outside changes."""
    case = tmp_path / f"case-{len(os.listdir(tmp_path))}"
    outside = case / "outside"
    outside.mkdir(parents=True)
    (outside / "keep").write_text("intact")
    members = data.draw(_members(str(outside)))
    layer = _layer(case, members)
    images = case / "img"
    try:
        convert_layer(layer, images / "x.erofs")
    except Invalid:
        assert not images.exists() or os.listdir(images) == []
    else:
        assert os.listdir(images) == ["x.erofs"]
    assert sorted(os.listdir(outside)) == ["keep"] and (outside / "keep").read_text() == "intact"
    assert _ours_in(SHARED_MEMORY) == []
