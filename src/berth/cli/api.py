"""``berth api``: the HTTP API's command group — ``berth api openapi`` prints its document.

The API itself is served by ``berth up`` and ``berth scheduler --http``
(:mod:`berth.cli.up`, :mod:`berth.cli.scheduler`); its clients' commands are
:mod:`berth.cli.workloads`, :mod:`berth.cli.nodes` and :mod:`berth.cli.images`.  This module
owns the group (:data:`api_app`) and its one subcommand.
"""

from __future__ import annotations

import typer

__all__ = ["api_app", "openapi"]

api_app = typer.Typer(help="The HTTP API (served by berth up and berth scheduler --http).")


@api_app.command("openapi")
def openapi() -> None:
    """Print the HTTP API's OpenAPI document (docs/openapi.json is this output)."""
    import json

    from berth.api.app import generated_openapi

    print(json.dumps(generated_openapi(), indent=2, ensure_ascii=False))
