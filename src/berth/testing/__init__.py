"""Test helpers that ship with berth so third-party drivers can run berth's own checks.

The contract suites (``*_contract``: placement, state store, node client, runtime,
registries), a real nats-server (:mod:`~berth.testing.nats`), the NATS cluster in one process
(:mod:`~berth.testing.cluster`), the HTTP API under test in process or over the network
(:mod:`~berth.testing.api`), and the one fake clock and test owner every test uses
(:mod:`~berth.testing.clock`, :mod:`~berth.testing.owner`).
"""
