"""The cluster: replicated node state (a store port and its drivers) and reaching nodes."""
