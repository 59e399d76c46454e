"""Tests on a real nats-server, berth's services in the test's own process."""
