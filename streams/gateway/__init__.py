"""The HTTP gateway: auth, validation, then the node (PROTOCOL.md is the contract)."""

from conveyor.streams.gateway.app import build_app, serve, start
from conveyor.streams.gateway.auth import KeyStore, ensure_dev_key
from conveyor.streams.gateway.registry import Registry

__all__ = ["KeyStore", "Registry", "build_app", "ensure_dev_key", "serve", "start"]
