"""The ``berth`` command line: every command, in one package, a module per command group.

:mod:`~berth.cli.main` is the app, its one-line errors and the one place every command is
registered: :mod:`~berth.cli.embedded` (``schedule``, ``cluster``: berth in one process),
:mod:`~berth.cli.sim` (``sim``, ``demo``), :mod:`~berth.cli.agent` (``agent``, embedded or
``--nats``), :mod:`~berth.cli.scheduler` (``scheduler``), :mod:`~berth.cli.up` (``up``),
:mod:`~berth.cli.placement` (``place``, ``whereis``, ``routes``), :mod:`~berth.cli.api` (``api
openapi``), the HTTP API's commands :mod:`~berth.cli.workloads` (``run``, ``ps``, ``stop``,
``explain``), :mod:`~berth.cli.nodes` (``nodes``, ``cordon``, ``uncordon``, ``drain``) and
:mod:`~berth.cli.images` (``images``), :mod:`~berth.cli.microvm` (``microvm setup``) and
:mod:`~berth.cli.deploy` (``deploy``); :mod:`~berth.cli.common` holds the flags and helpers
several of them share.  Commands are thin: they parse flags into berth's types, call the
library and render.
"""
