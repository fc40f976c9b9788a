"""The HTTP front: Klein routes that parse, call the core, and encode through one wire module."""
