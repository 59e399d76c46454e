"""The Docker Hub layer dataset: loading, counts, provenance, de-duplication, bad files."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from berth import Invalid, Layer, Platform, Request
from berth.dataset import DOCKERHUB_RESOURCE, Dataset, Image, load_dockerhub


def _raw() -> dict[str, Any]:
    text = resources.files("berth").joinpath(DOCKERHUB_RESOURCE).read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


def _document(*images: Any) -> dict[str, Any]:
    return {"source": "test", "images": list(images)}


def _image(name: str = "app", **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "name": name,
        "pull_count": 10,
        "platform": "linux/amd64",
        "layers": [{"digest": "sha256:base", "size": 100}, {"digest": "sha256:top", "size": 5}],
    }
    record.update(fields)
    return record


def test_bundled_dataset_counts() -> None:
    dataset = load_dockerhub()
    assert len(dataset) == len(dataset.images) == 145
    assert len(dataset.layers) == 858  # distinct digests
    assert dataset.layer_entries == 1068 - 4  # hipache repeats one digest four extra times
    assert dataset.distinct_bytes < dataset.total_bytes  # layers are shared between images
    assert dataset.total_bytes == sum(image.size for image in dataset.images)


def test_provenance_is_kept() -> None:
    source = load_dockerhub().source
    assert source == _raw()["source"]
    assert "Docker Hub" in source and "hermes" in source


def test_load_is_cached() -> None:
    assert load_dockerhub() is load_dockerhub()


def test_images_match_the_file() -> None:
    dataset = load_dockerhub()
    raw = _raw()["images"]
    assert dataset.names == tuple(record["name"] for record in raw)
    busybox = dataset.by_name("busybox")
    record = next(record for record in raw if record["name"] == "busybox")
    assert busybox.pull_count == record["pull_count"]
    assert busybox.platform == Platform.parse("linux/amd64")
    assert busybox.layers == tuple(Layer(id=x["digest"], size=x["size"]) for x in record["layers"])
    assert busybox.size == sum(layer["size"] for layer in record["layers"])
    assert "busybox" in dataset and "no-such-image" not in dataset


def test_duplicate_layers_within_an_image_keep_first_occurrence() -> None:
    raw = next(record for record in _raw()["images"] if record["name"] == "hipache")
    digests = [layer["digest"] for layer in raw["layers"]]
    assert len(digests) == 15 and len(set(digests)) == 11
    hipache = load_dockerhub().by_name("hipache")
    assert [layer.id for layer in hipache.layers] == list(dict.fromkeys(digests))


def test_every_image_makes_a_valid_request() -> None:
    for image in load_dockerhub().images:
        request = Request(
            namespace="t", name=image.name, platforms=(image.platform,), layers=image.layers
        )
        assert request.layers == image.layers


def test_unknown_image_is_invalid() -> None:
    with pytest.raises(Invalid, match="no-such-image") as caught:
        load_dockerhub().by_name("no-such-image")
    assert caught.value.field == "image"


def test_on_platforms_restricts_images() -> None:
    dataset = load_dockerhub()
    arm = dataset.on_platforms(["linux/aarch64"])
    assert len(arm) == 3 and arm.source == dataset.source
    assert {image.platform for image in arm.images} == {Platform.parse("linux/arm64/v8")}
    assert dataset.on_platforms([]) is dataset
    assert len(dataset.on_platforms(["linux/amd64", "windows/amd64"])) == 138
    with pytest.raises(Invalid, match="riscv64") as caught:
        dataset.on_platforms(["linux/riscv64"])
    assert caught.value.field == "platforms"


def test_from_path_reads_the_same_format(tmp_path: Path) -> None:
    path = tmp_path / "images.json"
    path.write_text(json.dumps(_raw()), encoding="utf-8")
    assert Dataset.from_path(path) == load_dockerhub()
    assert Dataset.from_path(str(path)) == load_dockerhub()


def test_from_path_dedupes_and_keeps_order(tmp_path: Path) -> None:
    layers = [{"digest": d, "size": s} for d, s in (("a", 1), ("b", 2), ("a", 1), ("c", 3))]
    path = tmp_path / "images.json"
    path.write_text(json.dumps(_document(_image(layers=layers))), encoding="utf-8")
    assert [layer.id for layer in Dataset.from_path(path).by_name("app").layers] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("document", "field", "message"),
    [
        (_document(_image(pull_count=-1)), "images.0.pull_count", "'app'"),
        (_document(_image(platform="linux/amd46")), "images.0.platform", "'app'"),
        (_document(_image(layers=[])), "images.0.layers", "'app'"),
        (_document(_image(name="")), "images.0.name", "image '' "),
        (
            _document(_image(), _image("b", layers=[{"digest": "x", "size": -1}])),
            "images.1.layers.0.size",
            "'b' (#1)",
        ),
        (
            _document(
                _image(
                    layers=[{"digest": "x", "size": 1}, {"digest": "x", "size": 1}, {"digest": "y"}]
                )
            ),
            "images.0.layers.2.size",
            "'app'",
        ),  # the file position, although a duplicate before it was dropped
        (_document(_image(layers=[{"size": 1}])), "images.0.layers.0.digest", "'app'"),
        (
            _document(_image(layers=[{"digest": "", "size": 1}])),
            "images.0.layers.0.digest",
            "'app'",
        ),
        (
            _document(_image(layers=[{"digest": "x", "size": 1, "mediaType": "?"}])),
            "images.0.layers.0",
            "mediaType",
        ),
        (_document(_image(layers=["sha256:x"])), "images.0.layers.0", "'app'"),
        (_document(_image(tag="latest")), "images.0.tag", "'app'"),
        (
            _document({"pull_count": 1, "platform": "linux/amd64", "layers": []}),
            "images.0.name",
            "image #0",
        ),
        (_document("busybox"), "images.0", "image #0"),
        (_document(_image(), _image()), "images", "'app' is listed more than once"),
        (
            _document(_image(), _image("b", layers=[{"digest": "sha256:top", "size": 6}])),
            "images",
            "'sha256:top' is 5 bytes in image 'app' but 6 bytes in image 'b'",
        ),
        ({"images": []}, "source", "required"),
        ({"source": "", "images": []}, "source", "at least 1"),
        ({"source": "x"}, "images", "list of images"),
        ({"source": "x", "images": [], "extra": 1}, "dataset", "extra"),
        ([], "dataset", "JSON object"),
    ],
)
def test_malformed_documents_name_image_and_field(document: Any, field: str, message: str) -> None:
    with pytest.raises(Invalid, match=re.escape(message)) as caught:
        Dataset.from_document(document)
    assert caught.value.field == field


def test_unreadable_files_are_invalid(tmp_path: Path) -> None:
    with pytest.raises(Invalid, match="cannot read") as caught:
        Dataset.from_path(tmp_path / "missing.json")
    assert caught.value.field == "path"
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(Invalid, match="not valid JSON") as caught:
        Dataset.from_path(broken)
    assert caught.value.field == "path"


def test_image_rejects_repeated_layers() -> None:
    with pytest.raises(Invalid, match="more than once") as caught:
        Image(name="a", pull_count=0, platform="linux/amd64", layers=(("x", 1), ("x", 1)))
    assert caught.value.field == "layers"


def test_dataset_round_trips_through_json() -> None:
    dataset = load_dockerhub().on_platforms(["linux/arm64"])
    assert Dataset.from_json(dataset.to_json()) == dataset
