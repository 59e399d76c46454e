"""Test helpers that ship with berth so third-party drivers can run berth's own checks."""
