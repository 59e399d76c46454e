"""Test helpers that ship with berth so third-party drivers can run berth's own checks.

The contract suites (``*_contract``: placement, state store, node client, runtime,
registries, leases), a real nats-server (:mod:`~berth.testing.nats`), the NATS cluster in
one process (:mod:`~berth.testing.cluster`), and the one fake clock and test owner every test uses
(:mod:`~berth.testing.clock`, :mod:`~berth.testing.owner`).  The HTTP API under test sits
with the API, a layer above (:mod:`berth.api.testing`).
"""
