"""What the container runtime is built from: the node's shared layer mounts and each
container's OCI bundle.

:mod:`~berth.node.container.mounts` mounts each layer file read-only once per node;
:mod:`~berth.node.container.bundle` writes the runtime spec ``runc`` runs a container from.
The runtime driver that uses them is :mod:`berth.node.runtime.container`.
"""
