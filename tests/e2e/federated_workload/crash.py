"""A client whose code crashes on import."""

import flwr  # noqa: F401

raise RuntimeError("client code broke on import: no weights for layer fc3")
