"""The ``berth`` command line: every command, in one package.

:mod:`~berth.cli.main` is the app and its embedded-cluster commands (``demo``, ``cluster``,
``agent``, ``schedule``); the rest register themselves on it: :mod:`~berth.cli.sim`
(``sim``, ``demo``), :mod:`~berth.cli.cluster` (berth across machines: ``agent --nats``,
``scheduler``, ``up``, ``place``, ``whereis``, ``routes``, ``api openapi``),
:mod:`~berth.cli.operator` (the HTTP API's commands: ``run``, ``ps``, ``stop``, ``nodes``,
``explain``, ``cordon``, ``drain``, ``images``) and :mod:`~berth.cli.microvm` (``microvm
setup``).  Commands are thin: they parse flags into berth's types, call the library and render.
"""
