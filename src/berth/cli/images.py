"""``berth images``: the registered images — list them, ``add`` one, ``import-oci`` a layout.

A command group of its own (:data:`images_app`): with no subcommand it lists the images; ``add``
registers one as its chain of layers with sizes (``--layer ID:SIZE``), ``import-oci`` reads a
local OCI image layout on the API's machine.  Each is a call to the HTTP API through
:mod:`berth.api.client`; ``--json`` prints the API's answer as one JSON document instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from berth.cli.common import (
    ApiOption,
    JsonOption,
    TokenOption,
    ask_api,
    counted,
    parse_layer_flag,
    say,
    show_table,
    size_text,
)

__all__ = ["images", "images_add", "images_app", "images_import_oci"]

_IMAGE_FLAGS = {"name": "NAME", "platform": "--platform", "layers": "--layer", "path": "PATH"}

images_app = typer.Typer(
    help="Registered images: list them (no command), add one, import an OCI layout."
)


@images_app.callback(invoke_without_command=True)
def images(
    context: typer.Context,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List registered images (or: berth images add / import-oci)."""
    if context.invoked_subcommand is not None:
        return
    found = ask_api(api, token, as_json, lambda client: client.images())
    if found is None:
        return
    items = sorted(found.items, key=lambda image: image.name)
    table = Table(title=counted(len(items), "image"))
    for column in ("image", "platform", "layers", "size"):
        table.add_column(column, no_wrap=column != "image")
    for image in items:
        table.add_row(
            escape(image.name),
            escape(image.platform or "any"),
            str(len(image.layers)),
            size_text(image.size),
        )
    show_table(table, whole=("image",))
    if not items:
        say(
            "register one: berth images add NAME --layer sha256:…:SIZE …, or berth images "
            "import-oci PATH (an OCI image layout on the API's machine)"
        )


def _print_image(image: Any, verb: str) -> None:
    say(
        f"{verb} {image.name}: {counted(len(image.layers), 'layer')}, {size_text(image.size)}, "
        f"platform {image.platform or 'any'}"
    )


def _registering(
    api: str | None, token: str | None, as_json: bool, register: Callable[[Any], Any], verb: str
) -> None:
    """Register an image with ``register(client)`` and say so — and, when it took the place
    of an image of that name, say that too, with what the old one was (never silently)."""
    from berth.validation import fields_as

    before: dict[str, Any] = {}

    def call(client: Any) -> Any:
        before.update((known.name, known) for known in client.images().items)
        return register(client)

    image = ask_api(api, token, as_json, call, fields_as(_IMAGE_FLAGS))
    if image is None:
        return
    old = before.get(image.name)
    if old is None:
        _print_image(image, verb)
        return
    _print_image(image, f"{verb}, replacing the image named")
    say(
        f"  (it was {counted(len(old.layers), 'layer')}, {size_text(old.size)}, platform "
        f"{old.platform or 'any'}; workloads already running keep their layers)"
    )


@images_app.command("add")
def images_add(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The image's name.")],
    layer: Annotated[
        list[str], typer.Option(help="A layer ID:SIZE, base layer first (repeatable).")
    ],
    platform: Annotated[str | None, typer.Option(help="The platform it was built for.")] = None,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register an image as its chain of layers with sizes (replacing one of that name)."""
    body: dict[str, Any] = {
        "name": name,
        "layers": [parse_layer_flag(text).model_dump() for text in layer],
    }
    if platform is not None:
        body["platform"] = platform
    _registering(api, token, as_json, lambda client: client.add_image(body), "registered")


@images_app.command("import-oci")
def images_import_oci(
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="An OCI image layout directory (index.json…).")
    ],
    name: Annotated[str | None, typer.Option(help="The name to register it under.")] = None,
    api: ApiOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register an image read from a local OCI image layout (on the API's machine)."""
    where = str(path.absolute())
    _registering(api, token, as_json, lambda client: client.import_oci(where, name), "imported")
