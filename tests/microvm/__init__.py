"""Tests that boot real QEMU guests."""
