"""The teacher server's routes, one module per resource under ``/v1``."""
