"""Who may say what on a berth cluster: generated users and a nats-server configuration.

``berth up`` turns authentication on by default.  :func:`generate` makes one user per role
— the scheduler and client roles with a random password, **each node with an nkey** (an
Ed25519 key pair: the server's configuration names only its public key, and the agent proves
it holds the seed by signing the server's nonce, so the file every server reads holds no
node's secret and no node's secret crosses the network) — and
:meth:`ClusterAuth.server_config` writes the nats-server configuration that confines each one
(an account with JetStream, per-user publish and subscribe allow lists):

* **a node** (one user per node) may publish *only its own key* in the nodes bucket and its
  own routes, read *only its own* routes (a consumer of the routes bucket whose filter,
  named in the create request's subject, is its own keys:
  :meth:`~berth.registry.nats_routes.NatsRoutes.on_node`; no direct gets, no watch of the
  whole bucket), publish *only its own* workload events (``berth.events.<node>``), subscribe
  *only to its own subjects* (``berth.node.<node>.*``) and answer the
  requests it receives (``allow_responses``) — so it cannot overwrite another node's state,
  nor answer for another node;
* **a scheduler** may read the node states (JetStream consumers on the nodes bucket, never a
  publish to it), send requests to any node, serve the scheduler subjects and keep the routing
  registry — and, for the HTTP API it may serve, ask the scheduler queue group and keep the
  API's bucket of workloads and images (``berth_api``) and the reconciler's lease
  (``berth_leases``), and consume the nodes' workload events (``berth_events``, the API's
  durable consumer: fetch, acknowledge — never publish an event);
* **a client** (the caller of the placement port, ``berth place``, ``berth routes``) may ask
  the schedulers, bind or release on nodes, and read the routes.

Every user has its own inbox prefix (``_INBOX_<user>``), so replies meant for one user are
not readable by another (a plain ``_INBOX.>`` permission would let any user read every reply).
A violation is refused by the server and reported to the client asynchronously (its error
callback), as docs/design.md §5 notes.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from berth.nats.connection import Credentials
from berth.nats.names import API_BUCKET, LEASE_BUCKET, Names
from berth.nats.wire import node_token
from berth.private import write_private

__all__ = ["ClusterAuth", "generate"]


@dataclass(frozen=True)
class ClusterAuth:
    """One user per role (see the module docstring)."""

    scheduler: Credentials
    client: Credentials
    nodes: dict[str, Credentials] = field(default_factory=dict)
    names: Names = field(default_factory=Names)

    def server_config(self) -> str:
        """The nats-server configuration (its ``accounts`` block) for these users."""
        users = [_user(self.scheduler, self._scheduler_permissions())]
        users.append(_user(self.client, self._client_permissions()))
        users += [_user(creds, self._node_permissions(node)) for node, creds in self.nodes.items()]
        lines = ["accounts: {", "  BERTH: {", "    jetstream: enabled", "    users: ["]
        lines += [f"      {user}" for user in users]
        lines += ["    ]", "  }", "}", ""]
        return "\n".join(lines)

    def write(self, directory: Path) -> dict[str, Path]:
        """Write ``server.conf`` and one credentials file per user into ``directory``, each
        readable by its owner only from its creation."""
        directory.mkdir(parents=True, exist_ok=True)
        paths = {"server": directory / "server.conf"}
        write_private(paths["server"], self.server_config())  # every password is in it
        roles = {"scheduler": self.scheduler, "client": self.client}
        roles.update({f"node-{node}": creds for node, creds in self.nodes.items()})
        for role, creds in roles.items():
            path = directory / f"{node_token(role)}.creds.json"
            write_private(path, json.dumps(creds.document()))
            paths[role] = path
        return paths

    # -- permissions -------------------------------------------------------------------------
    def _js(self, bucket: str, *, read: bool, create: bool = True) -> list[str]:
        stream = f"KV_{bucket}"
        subjects = [f"$JS.API.STREAM.INFO.{stream}"]
        if create:
            subjects.append(f"$JS.API.STREAM.CREATE.{stream}")
        if read:
            subjects += [
                f"$JS.API.CONSUMER.CREATE.{stream}",
                f"$JS.API.CONSUMER.CREATE.{stream}.>",
                f"$JS.API.CONSUMER.INFO.{stream}.>",
                f"$JS.API.CONSUMER.DELETE.{stream}.>",
                f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",  # a routes read's pull consumer
                f"$JS.API.STREAM.MSG.GET.{stream}",
            ]
        return subjects

    def _node_permissions(self, node: str) -> dict[str, object]:
        s, token = self.names, node_token(node)
        publish = [
            f"$KV.{s.nodes_bucket}.{token}",
            f"$KV.{s.routes_bucket}.{token}.>",
            "$JS.API.INFO",
            f"$JS.API.STREAM.MSG.GET.KV_{s.nodes_bucket}",
            "$JS.FC.>",
            *self._js(s.nodes_bucket, read=False),
            # its own routes only (security finding 5): the bucket, and read consumers whose
            # filter — in the create request's subject — is its own keys (NatsRoutes._read)
            *self._js(s.routes_bucket, read=False),
            f"$JS.API.CONSUMER.CREATE.KV_{s.routes_bucket}.*.$KV.{s.routes_bucket}.{token}.>",
            f"$JS.API.CONSUMER.MSG.NEXT.KV_{s.routes_bucket}.*",
            f"$JS.API.CONSUMER.DELETE.KV_{s.routes_bucket}.*",
            # its own workload events, stored with an acknowledgement (berth.events.nats)
            f"{s.events_prefix}.{token}",
            f"$JS.API.STREAM.INFO.{s.events_stream}",
            f"$JS.API.STREAM.CREATE.{s.events_stream}",
        ]
        subscribe = [f"{s.node_prefix}.{token}.*", f"{self.nodes[node].inbox_prefix}.>"]
        return {"publish": publish, "subscribe": subscribe, "allow_responses": True}

    def _scheduler_permissions(self) -> dict[str, object]:
        s = self.names
        publish = [
            f"{s.node_prefix}.*.*",
            f"$KV.{s.routes_bucket}.>",
            "$JS.API.INFO",
            f"$JS.API.STREAM.PURGE.KV_{s.routes_bucket}",
            # closing the buckets nodes write to rollups (berth.nats.streams)
            f"$JS.API.STREAM.UPDATE.KV_{s.nodes_bucket}",
            f"$JS.API.STREAM.UPDATE.KV_{s.routes_bucket}",
            "$JS.FC.>",
            *self._js(s.nodes_bucket, read=True),
            *self._js(s.routes_bucket, read=True),
            # the HTTP API in a scheduler's process: placements through the queue group, and
            # its registries of workloads and images (berth.registry.nats)
            f"{s.scheduler_prefix}.*",
            f"$KV.{API_BUCKET}.>",
            *self._js(API_BUCKET, read=True),
            # the one reconciler at a time: its lease (berth.registry.nats_lease)
            f"$KV.{LEASE_BUCKET}.>",
            *self._js(LEASE_BUCKET, read=True),
            # the nodes' workload events: the API's durable pull consumer (berth.events.nats)
            f"$JS.API.STREAM.INFO.{s.events_stream}",
            f"$JS.API.STREAM.CREATE.{s.events_stream}",
            f"$JS.API.CONSUMER.CREATE.{s.events_stream}",
            f"$JS.API.CONSUMER.CREATE.{s.events_stream}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{s.events_stream}.>",
            f"$JS.API.CONSUMER.INFO.{s.events_stream}.>",
            f"$JS.API.CONSUMER.MSG.NEXT.{s.events_stream}.>",
            f"$JS.ACK.{s.events_stream}.>",
        ]
        subscribe = [f"{s.scheduler_prefix}.*", f"{self.scheduler.inbox_prefix}.>"]
        return {"publish": publish, "subscribe": subscribe, "allow_responses": True}

    def _client_permissions(self) -> dict[str, object]:
        s = self.names
        publish = [
            f"{s.scheduler_prefix}.*",
            f"{s.node_prefix}.*.bind",
            f"{s.node_prefix}.*.release",
            "$JS.FC.>",
            *self._js(s.routes_bucket, read=True),
        ]
        subscribe = [f"{self.client.inbox_prefix}.>"]
        return {"publish": publish, "subscribe": subscribe}


def _user(credentials: Credentials, permissions: dict[str, object]) -> str:
    publish = json.dumps({"allow": permissions["publish"]})
    subscribe = json.dumps({"allow": permissions["subscribe"]})
    responses = ", allow_responses: true" if permissions.get("allow_responses") else ""
    who = (
        f"user: {json.dumps(credentials.user)}, password: {json.dumps(credentials.password)}"
        if credentials.public_key is None
        else f"nkey: {json.dumps(credentials.public_key)}"
    )
    return f"{{{who}, permissions: {{publish: {publish}, subscribe: {subscribe}{responses}}}}}"


def generate(nodes: list[str], names: Names | None = None) -> ClusterAuth:
    """Fresh users: a scheduler role and a client role with random passwords, an nkey for
    each node."""

    def user(name: str) -> Credentials:
        return Credentials(user=name, password=secrets.token_urlsafe(18))

    return ClusterAuth(
        scheduler=user("scheduler"),
        client=user("client"),
        nodes={node: Credentials.nkey(f"node-{node_token(node)}") for node in nodes},
        names=names or Names(),
    )
