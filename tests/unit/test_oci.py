"""berth.oci: reading OCI image layouts (and the writer tests build them with)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from berth.errors import Invalid
from berth.model import Layer
from berth.oci import (
    MEDIA_INDEX,
    ImageSpec,
    OciImage,
    directory,
    file,
    hardlink,
    layout_refs,
    opaque,
    read_layout,
    symlink,
    verify_blob,
    whiteout,
    write_layout,
)
from berth.platform import Platform

BASE = [directory("bin"), file("bin/sh", b"#!shell\n", 0o755), symlink("bin/ls", "sh")]
APP = [directory("app"), file("app/main.py", "print('hi')\n"), whiteout("bin/ls")]


def _layout(tmp_path: Path, **kwargs: Any) -> Path:
    spec = ImageSpec(layers=[BASE, APP], cmd=("/app/main.py",), env=("A=1", "B=x=y"))
    return write_layout(tmp_path / "layout", spec, **kwargs)


def _blob(root: Path, digest: str) -> Path:
    return root / "blobs" / "sha256" / digest.removeprefix("sha256:")


def _index(root: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((root / "index.json").read_text())
    return document


def _manifest_of(image: OciImage) -> Path:
    return _blob(image.layout, image.digest)


def _rewrite_json_blob(root: Path, path: Path, document: dict[str, Any]) -> str:
    """Replace a JSON blob by ``document`` under its new digest; return that digest."""
    data = json.dumps(document).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _blob(root, digest).write_bytes(data)
    return digest


def _point_index_at(root: Path, digest: str, size: int) -> None:
    index = _index(root)
    index["manifests"][0]["digest"] = digest
    index["manifests"][0]["size"] = size
    (root / "index.json").write_text(json.dumps(index))


def test_a_written_layout_reads_back(tmp_path: Path) -> None:
    root = _layout(tmp_path)
    image = read_layout(root, platform="linux/amd64")
    assert image.ref == "latest"
    assert image.platform == Platform.parse("linux/amd64")
    assert len(image.layers) == 2
    assert image.config.command == ("/app/main.py",)
    assert image.config.environment() == {"A": "1", "B": "x=y"}
    for layer in image.layers:
        assert layer.path == _blob(root, layer.digest)
        assert layer.size == layer.path.stat().st_size
        assert layer.compression == "gzip"
        verify_blob(layer)
        assert layer.diff_id is not None
        with gzip.open(layer.path) as raw:
            assert "sha256:" + hashlib.sha256(raw.read()).hexdigest() == layer.diff_id
    assert image.berth_layers() == tuple(Layer(id=x.digest, size=x.size) for x in image.layers)
    with tarfile.open(image.layers[1].path) as tar:
        assert tar.getnames() == ["app", "app/main.py", "bin/.wh.ls"]


def test_output_is_reproducible(tmp_path: Path) -> None:
    first = read_layout(
        write_layout(tmp_path / "a", ImageSpec(layers=[BASE])), platform="linux/amd64"
    )
    second = read_layout(
        write_layout(tmp_path / "b", ImageSpec(layers=[BASE])), platform="linux/amd64"
    )
    assert first.digest == second.digest
    assert first.layers[0].digest == second.layers[0].digest


def test_plain_tar_layers(tmp_path: Path) -> None:
    image = read_layout(_layout(tmp_path, compression="none"), platform="linux/amd64")
    assert {layer.compression for layer in image.layers} == {"none"}
    assert image.layers[0].media_type == "application/vnd.oci.image.layer.v1.tar"
    with tarfile.open(image.layers[0].path, mode="r:") as tar:
        assert "bin/sh" in tar.getnames()


def test_layers_from_a_directory_keep_modes_links_and_hardlinks(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "d").mkdir(parents=True)
    (source / "d" / "run").write_text("x")
    (source / "d" / "run").chmod(0o750)
    (source / "d" / "same").hardlink_to(source / "d" / "run")
    (source / "link").symlink_to("d/run")
    image = read_layout(
        write_layout(tmp_path / "l", ImageSpec(layers=[source])), platform="linux/amd64"
    )
    with tarfile.open(image.layers[0].path) as tar:
        members = {member.name: member for member in tar}
    assert members["d/run"].mode == 0o750
    assert members["d/same"].islnk() and members["d/same"].linkname == "d/run"
    assert members["link"].issym() and members["link"].linkname == "d/run"


def test_tar_bytes_as_a_layer(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("etc/hostname")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"node\n"))
    image = read_layout(
        write_layout(tmp_path / "l", ImageSpec(layers=[buffer.getvalue()])), platform="linux/amd64"
    )
    with tarfile.open(image.layers[0].path) as tar:
        member = tar.extractfile("etc/hostname")
        assert member is not None and member.read() == b"node\n"


def test_multi_platform_index_resolves_by_platform(tmp_path: Path) -> None:
    root = write_layout(
        tmp_path / "l",
        [
            ImageSpec(layers=[[file("arch", "amd64")]], platform="linux/amd64"),
            ImageSpec(layers=[[file("arch", "arm64")]], platform="linux/arm64"),
        ],
        ref="multi",
    )
    assert _index(root)["manifests"][0]["mediaType"] == MEDIA_INDEX
    amd = read_layout(root, ref="multi", platform="linux/amd64")
    arm = read_layout(root, ref="multi", platform="linux/aarch64")
    assert amd.platform == Platform.parse("linux/amd64")
    assert arm.platform == Platform.parse("linux/arm64/v8")
    assert amd.layers[0].digest != arm.layers[0].digest
    with pytest.raises(
        Invalid, match=r"no image for platform linux/s390x.*linux/amd64, linux/arm64"
    ) as error:
        read_layout(root, ref="multi", platform="linux/s390x")
    assert error.value.field == "platform"


def test_attestation_entries_in_an_index_are_skipped(tmp_path: Path) -> None:
    root = write_layout(
        tmp_path / "l",
        [ImageSpec(layers=[BASE]), ImageSpec(layers=[BASE], platform="linux/arm64")],
    )
    index_blob = _blob(root, _index(root)["manifests"][0]["digest"])
    document = json.loads(index_blob.read_text())
    attestation = dict(
        document["manifests"][0], platform={"os": "unknown", "architecture": "unknown"}
    )
    document["manifests"].insert(0, attestation)
    digest = _rewrite_json_blob(root, index_blob, document)
    _point_index_at(root, digest, _blob(root, digest).stat().st_size)
    assert read_layout(root, platform="linux/arm64").platform == Platform.parse("linux/arm64")


def test_refs_select_images(tmp_path: Path) -> None:
    root = tmp_path / "l"
    write_layout(root, ImageSpec(layers=[BASE], cmd=("one",)), ref="one")
    write_layout(root, ImageSpec(layers=[BASE], cmd=("two",)), ref="two")
    write_layout(root, ImageSpec(layers=[BASE], cmd=("two-again",)), ref="two")
    assert layout_refs(root) == ("one", "two")
    assert read_layout(root, ref="one").config.cmd == ("one",)
    assert read_layout(root, ref="two").config.cmd == ("two-again",)
    with pytest.raises(Invalid, match=r"no image named 'three'.*'one', 'two'"):
        read_layout(root, ref="three")
    with pytest.raises(Invalid, match="holds 2 images; choose one by reference") as error:
        read_layout(root)
    assert error.value.field == "ref"


def _broken(tmp_path: Path, edit: Any) -> Path:
    root = _layout(tmp_path)
    edit(root)
    return root


def _edit_index(change: Any) -> Any:
    def edit(root: Path) -> None:
        index = _index(root)
        change(index)
        (root / "index.json").write_text(json.dumps(index))

    return edit


def _edit_manifest(change: Any) -> Any:
    def edit(root: Path) -> None:
        descriptor = _index(root)["manifests"][0]
        path = _blob(root, descriptor["digest"])
        manifest = json.loads(path.read_text())
        change(root, manifest)
        digest = _rewrite_json_blob(root, path, manifest)
        _point_index_at(root, digest, _blob(root, digest).stat().st_size)

    return edit


def _set_layer(key: str, value: Any) -> Any:
    return _edit_manifest(lambda root, manifest: manifest["layers"][0].__setitem__(key, value))


def _truncate_first_layer(root: Path, manifest: dict[str, Any]) -> None:
    blob = _blob(root, manifest["layers"][0]["digest"])
    blob.write_bytes(blob.read_bytes()[:-1])


def _escape_blobs(root: Path, manifest: dict[str, Any]) -> None:
    digest = manifest["layers"][0]["digest"].removeprefix("sha256:")
    outside = root.parent / "outside"
    outside.mkdir()
    (outside / digest).write_bytes(_blob(root, manifest["layers"][0]["digest"]).read_bytes())
    _blob(root, manifest["layers"][0]["digest"]).unlink()
    _blob(root, manifest["layers"][0]["digest"]).symlink_to(outside / digest)


ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
BAD = [
    ("missing oci-layout", lambda root: (root / "oci-layout").unlink(), "oci-layout", "is missing"),
    (
        "index not JSON",
        lambda root: (root / "index.json").write_text("{"),
        "index.json",
        "not valid JSON",
    ),
    (
        "index a list",
        lambda root: (root / "index.json").write_text("[]"),
        "index.json",
        "expected a JSON object",
    ),
    (
        "bad version",
        lambda root: (root / "oci-layout").write_text('{"imageLayoutVersion": "2.0"}'),
        "oci-layout imageLayoutVersion",
        "'2.0'",
    ),
    (
        "no manifests",
        _edit_index(lambda i: i.__setitem__("manifests", [])),
        "index.json manifests",
        "no entries",
    ),
    (
        "bad digest",
        _edit_index(lambda i: i["manifests"][0].__setitem__("digest", "sha256:XYZ")),
        "index.json manifests.0.digest",
        "'sha256:XYZ'",
    ),
    (
        "md5 digest",
        _edit_index(lambda i: i["manifests"][0].__setitem__("digest", "md5:" + "0" * 32)),
        "index.json manifests.0.digest",
        "64 lowercase hex",
    ),
    (
        "size a string",
        _edit_index(lambda i: i["manifests"][0].__setitem__("size", "12")),
        "index.json manifests.0.size",
        "'12'",
    ),
    (
        "size wrong",
        _edit_index(lambda i: i["manifests"][0].__setitem__("size", 3)),
        "index.json manifests.0.size",
        "the descriptor says 3",
    ),
    (
        "missing manifest",
        _edit_index(lambda i: i["manifests"][0].__setitem__("digest", "sha256:" + "a" * 64)),
        "index.json manifests.0.digest",
        "is missing",
    ),
    (
        "foreign media type",
        _edit_index(lambda i: i["manifests"][0].__setitem__("mediaType", "text/plain")),
        "index.json manifests.0.mediaType",
        "'text/plain'",
    ),
    ("zstd layer", _set_layer("mediaType", ZSTD), "layers.0.mediaType", "tar+zstd"),
    ("layer size", _set_layer("size", 1), "layers.0.size", "the descriptor says 1"),
    ("layer digest", _set_layer("digest", "sha256:" + "b" * 64), "layers.0.digest", "is missing"),
    (
        "layer truncated",
        _edit_manifest(_truncate_first_layer),
        "layers.0.size",
        "the descriptor says",
    ),
    ("blob outside", _edit_manifest(_escape_blobs), "layers.0.digest", "leads outside the layout"),
    ("urls", _set_layer("urls", ["http://example.com/x"]), "layers.0.urls", "foreign layers"),
    (
        "no layers key",
        _edit_manifest(lambda root, m: m.pop("layers")),
        "layers",
        "required, but missing",
    ),
]


@pytest.mark.parametrize(
    ("edit", "field", "message"), [case[1:] for case in BAD], ids=[c[0] for c in BAD]
)
def test_bad_layouts_are_invalid_naming_file_and_field(
    tmp_path: Path, edit: Any, field: str, message: str
) -> None:
    root = _broken(tmp_path, edit)
    with pytest.raises(Invalid) as error:
        read_layout(root, platform="linux/amd64")
    assert error.value.field is not None and error.value.field.endswith(field), error.value
    assert message in str(error.value)


def test_tampered_json_blob_fails_its_digest(tmp_path: Path) -> None:
    root = _layout(tmp_path)
    manifest = _blob(root, _index(root)["manifests"][0]["digest"])
    data = manifest.read_bytes()
    manifest.write_bytes(data.replace(b'"schemaVersion":2', b'"schemaVersion":3'))
    with pytest.raises(Invalid, match="content hashes to sha256:") as error:
        read_layout(root)
    assert error.value.field is not None and error.value.field.startswith("blobs/sha256/")


def test_tampered_layer_fails_verify_blob(tmp_path: Path) -> None:
    image = read_layout(_layout(tmp_path), platform="linux/amd64")
    data = bytearray(image.layers[0].path.read_bytes())
    data[-1] ^= 0xFF
    image.layers[0].path.write_bytes(bytes(data))
    with pytest.raises(Invalid, match="content hashes to"):
        verify_blob(image.layers[0])


def test_config_fields_are_checked(tmp_path: Path) -> None:
    root = tmp_path / "l"
    write_layout(root, ImageSpec(layers=[BASE], extra_config={"os": "lunix"}))
    with pytest.raises(Invalid, match="unknown operating system 'lunix'") as error:
        read_layout(root)
    assert error.value.field is not None and "os/architecture" in error.value.field
    write_layout(root, ImageSpec(layers=[BASE], extra_config={"config": {"Cmd": "sh -c x"}}))
    with pytest.raises(Invalid, match="expected a list of strings") as error:
        read_layout(root)
    assert error.value.field is not None and error.value.field.endswith("config.Cmd")


def test_wrong_platform_for_a_single_manifest(tmp_path: Path) -> None:
    root = write_layout(tmp_path / "l", ImageSpec(layers=[BASE], platform="linux/arm64"))
    assert read_layout(root).platform == Platform.parse("linux/arm64")  # no platform asked
    with pytest.raises(Invalid, match="is for linux/arm64/v8, not linux/amd64"):
        read_layout(root, platform="linux/amd64")


@pytest.mark.parametrize("path", ["", "nope", "file"])
def test_not_a_layout_directory(tmp_path: Path, path: str) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(Invalid) as error:
        read_layout(tmp_path / path if path else path)
    assert error.value.field in ("layout", "oci-layout")


def test_hardlink_and_opaque_members(tmp_path: Path) -> None:
    members = [directory("d"), file("d/a", "x"), hardlink("d/b", "d/a"), opaque("d")]
    image = read_layout(write_layout(tmp_path / "l", ImageSpec(layers=[members])))
    with tarfile.open(image.layers[0].path) as tar:
        names = {member.name: member for member in tar}
    assert names["d/b"].islnk()
    assert "d/.wh..wh..opq" in names
