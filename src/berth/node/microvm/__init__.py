"""Real microVMs for the node: the guest's files, its init, and QEMU's ``microvm`` machine.

``paths`` — berth's microVM data directory and what a host lacks (``berth agent --check``);
``setup`` — ``berth microvm setup``: Debian's cloud kernel and modules, the initramfs, the
acceleration probe; ``initramfs`` — the busybox init that stacks an image's layers with
overlayfs and runs the workload; ``qemu`` — one guest's QEMU command line and sizing; ``vm`` —
one running guest seen from the host; ``scratch`` — one guest's files on the host (its scratch
directory: initramfs, upper disk, console); ``machine`` — one guest's QEMU run under a
supervisor, adopted after a restart, and its end in the runtime port's terms.  The runtime
driver that boots workloads with them is :mod:`berth.node.runtime.microvm`.
"""
